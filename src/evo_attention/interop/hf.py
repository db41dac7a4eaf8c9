"""Export a trained model as a Hugging Face ``transformers`` model directory (``export --format hf``).

The directory loads with the Auto classes, the model code coming from the directory itself::

    config = AutoConfig.from_pretrained(DIR, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)  # the flag only spares a question

It holds:

    config.json                      ``EvoAttentionConfig``: the model's shape (the ``ModelSpec`` fields),
                                     one gene key per layer, ``auto_map`` naming the two classes below
    configuration_evo_attention.py   ``EvoAttentionConfig`` (a ``PretrainedConfig``)
    modeling_evo_attention.py        ``EvoAttentionForCausalLM`` (``PreTrainedModel`` + ``GenerationMixin``),
                                     which wraps the library's ``TinyTransformer``
    evo_attention_*.py               the library's own modules that the model runs, flat (``nn/model.py``
                                     is ``evo_attention_nn_model.py``), their imports made relative, and
                                     ``evo_attention_plugins_<module>.py``: the module of each plugin whose
                                     ops or components the genes use (``export.plugin_source``), which the
                                     modeling file imports before it builds a model
    model.safetensors                the library's state dict, keys prefixed ``model.`` (the tied head once)
    tokenizer.json                   the run's tokenizer as a ``tokenizers`` fast tokenizer, with
    tokenizer_config.json            ``tokenizer_class: PreTrainedTokenizerFast``
    README.md                        how to load it and what it needs
    lm_eval_task.yaml, lm_eval_*.jsonl  an lm-evaluation-harness task over a split of the training
                                     data (``write_lm_eval_task``; written by the CLI, which builds the data)

Contract:

- One implementation: the wrapper holds no model logic. Its ``model`` attribute is the library's
  ``TinyTransformer`` (shipped by ``export.module_sources(..., flat=True)``), so the logits are the
  library's; generation runs the library's cached decoding behind ``past_key_values``.
- Flat, because transformers copies a remote-code model into its module cache by following the
  modeling file's ``from .<module> import`` lines only, so the modeling file names every shipped module.
- The tokenizer gives the library tokenizer's ids: word level (``<eos>`` for every newline, as
  ``encode_prompt``; ``<eos>`` is its ``eos_token``), characters, bytes, and BPE. A generated task's
  symbols (a word vocabulary without ``<eos>``: recall, mqar, the MAD tasks) are words split on
  whitespace, id 0 (the task's filler) the ``bos_token`` (lm-evaluation-harness needs one).
- Every export's ``pad_token`` is ``<pad>``, id ``vocab_size``: a token after the vocabulary (never
  embedded), which no text gives (``split_special_tokens``: a special token's text reads as text).
- Batches: left padding runs row by row on each row's real tokens (what ``generate`` expects); right
  padding only without a cache; without a cache generation stops at the window.
- Writing needs no ``transformers`` (only ``tokenizers``); loading needs ``transformers``, ``torch``
  and what the shipped modules import (``entmax`` for the sparse normalizations).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from evo_attention.data.tokenizers import (BPETokenizer, ByteTokenizer, CharTokenizer, Tokenizer, WordTokenizer,
                                           byte_alphabet, as_tokenizer)
from evo_attention.data.vocab import UNK
from evo_attention.data.words import EOS
from evo_attention.interop.export import check_exportable, flat_name, module_sources, plugin_names, requirements
from evo_attention.interop.pretrained import MODEL_TYPE, sha256
from evo_attention.nn.spec import ModelSpec
from evo_attention.util.errors import UserError
from evo_attention.util.files import check_output, output_dir, register_output_kind, write_bytes, write_text
from evo_attention.util.version import __version__

MODEL_ROOTS = ("evo_attention.nn.model",)  # what the model code ships (with every library module it imports)
CONFIG_MODULE = "configuration_evo_attention"
MODELING_MODULE = "modeling_evo_attention"
CONFIG_CLASS = "EvoAttentionConfig"
MODEL_CLASS = "EvoAttentionForCausalLM"
WEIGHTS_FILE = "model.safetensors"
PREFIX = "model."  # the wrapper's attribute holding the library's TinyTransformer

_CONFIGURATION = '''"""The configuration of an evo-attention model (made by `evo-attention export --format hf`,
evo-attention {version}): the library's ModelSpec fields (the model's shape) and one gene key per layer."""

import dataclasses

from transformers import PretrainedConfig

from .{spec_module} import ModelSpec

SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(ModelSpec))


class {config_class}(PretrainedConfig):
    """``genes``: one gene key per layer; ``vocab_size``, ``d_model``, ``n_heads``, ``n_layers``,
    ``max_seq_len``, ``dropout``, ``d_ff``, ``block``, ``favor_features``: the library's ``ModelSpec``
    (its defaults are theirs)."""

    model_type = "{model_type}"
    attribute_map = {{"hidden_size": "d_model", "num_attention_heads": "n_heads", "num_hidden_layers": "n_layers",
                     "max_position_embeddings": "max_seq_len"}}

    def __init__(self, genes=None, tie_word_embeddings=True, **kwargs):
        for field in dataclasses.fields(ModelSpec):
            setattr(self, field.name, kwargs.pop(field.name, field.default))
        self.genes = list(genes) if genes is not None else None
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def spec(self) -> ModelSpec:
        """The library's ModelSpec of these settings."""
        return ModelSpec(**{{name: getattr(self, name) for name in SPEC_FIELDS}})
'''

_MODELING = '''"""{model_class}: an evo-attention model as a transformers causal language model (made by
`evo-attention export --format hf`, evo-attention {version}).

The model is the library's own TinyTransformer (``self.model``), whose modules lie beside this file
(``evo_attention_*.py``: the library's files, their imports made relative); this file only adapts its
interface. ``model(input_ids)`` runs the library's forward pass; with ``use_cache=True`` (what
``generate`` passes) it runs the library's cached decoding instead and returns its caches as
``past_key_values``. A model sees at most ``max_seq_len`` positions; while generating past that the
window slides (the caches are filled again from the last ``max_seq_len`` tokens), as the library's
generate does; without the cache, generation stops at the window. A batch padded on the left (what
``generate`` expects) runs row by row on each row's real tokens, so every row gives the numbers it
gives alone; right padding is fine without a cache (a causal model's real positions do not see it)
and refused for generation.
"""

import hashlib
import json
import os

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.generation.stopping_criteria import MaxLengthCriteria
from transformers.modeling_outputs import CausalLMOutputWithPast

from .{config_module} import {config_class}
from .{genes_module} import AttentionGene
from .{model_module} import Block, TinyTransformer

# transformers >= 5.24 names an output's cache ``cache`` (``past_key_values`` still works, with a warning)
_CACHE_FIELD = "cache" if "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {{}}) else "past_key_values"

# The library's modules shipped beside this file. transformers copies into its module cache the files
# that this file reaches through "from .<module> import" lines (and theirs); the library's modules
# also import each other as "from . import <module>", which it does not follow, so each is named here.
{listing}
LIBRARY_MODULES = ({names})
{plugins}

class EvoAttentionCache:
    """``past_key_values``: the library's cache of every layer (``TinyTransformer.new_caches()``: keys
    and values, or a kernel normalization's running sums) and the ids fed so far; for a padded batch,
    one such cache per row (``rows``), each fed only its row's real tokens."""

    is_compileable = False
    is_croppable = False

    def __init__(self, model: TinyTransformer, rows: int | None = None):
        self.caches = model.new_caches()
        self.ids = None
        self.length = 0  # positions fed so far, padding included (what transformers counts)
        self.rows = None if rows is None else [EvoAttentionCache(model) for _ in range(rows)]

    def get_seq_length(self, layer_idx=0) -> int:
        return self.length

    def extend(self, model: TinyTransformer, ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab] of ``ids`` [B, T], the positions after those fed so far, from the
        library's cached decoding. Past ``max_seq_len`` positions the caches are filled again from the
        last ``max_seq_len`` ids (the library's generate does the same): the ids that fit go in at
        once, each later one alone, so every position's logits read exactly its last ``max_seq_len`` ids."""
        window = model.spec.max_seq_len
        room = window - (0 if self.ids is None else self.ids.shape[1])
        if ids.shape[1] > max(room, 1):
            parts = ([ids[:, :room]] if room > 0 else []) + list(ids[:, max(room, 0):].split(1, dim=1))
            return torch.cat([self.extend(model, part) for part in parts], dim=1)
        seen = ids if self.ids is None else torch.cat([self.ids, ids], dim=1)
        if seen.shape[1] > window:
            self.caches = model.new_caches()
            logits = model.decode(seen[:, -window:], self.caches)[:, -ids.shape[1]:]
        else:
            logits = model.decode(ids, self.caches)
        self.ids = seen
        self.length += ids.shape[1]
        return logits


def _padding(attention_mask, length: int, cached: bool):
    """None when ``attention_mask`` leaves every position in; else the mask of the ``length`` new
    positions [B, length] (True = a real token) for a batch padded on the left, which runs row by
    row on its real tokens. A right-padded batch needs nothing while no cache is kept (a causal
    model's real positions never see the padding after them); generating from it is refused, since
    the next token would be read at a padded position."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    mask = attention_mask.bool()
    rises = mask[:, 1:] & ~mask[:, :-1]  # a real token after padding
    if not bool(rises.any()):  # padding on the right only
        if cached:
            raise ValueError("this batch is padded on the right: generation would continue each row after its "
                             "padding; pad on the left (tokenizer.padding_side = 'left'), as transformers' "
                             "generate expects")
        return None
    if bool((rises.sum(dim=1) > 1).any()) or bool((mask[:, :-1] & ~mask[:, 1:]).any()):
        raise ValueError("padding inside a sequence is not supported: pad on the left "
                         "(tokenizer.padding_side = 'left')")
    return mask[:, -length:]


def check_files(path, kwargs) -> None:
    """Every file that the export's config.json lists (``evo_attention.files``: its sha256 when it was
    exported) checked before the model loads: an altered or damaged file is refused, naming it."""
    def local(name):
        if os.path.isdir(path):
            return os.path.join(path, kwargs.get("subfolder") or "", name)
        from transformers.utils import cached_file

        hub = ("cache_dir", "revision", "token", "local_files_only", "subfolder", "force_download", "proxies")
        return cached_file(path, name, **{{k: kwargs[k] for k in hub if k in kwargs}})

    with open(local("config.json"), encoding="utf-8") as f:
        listed = (json.load(f).get("evo_attention") or {{}}).get("files") or {{}}
    for name, expected in listed.items():
        digest = hashlib.sha256()
        with open(local(name), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() != expected:
            raise OSError(f"{{local(name)}} was altered or damaged (its sha256 differs from the one config.json lists): "
                          "restore it or export the model again (evo-attention export --format hf)")


class {model_class}(PreTrainedModel, GenerationMixin):
    config_class = {config_class}
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _tied_weights_keys = {{"model.head.weight": "model.tok_emb.weight"}}

    def __init__(self, config: {config_class}):
        super().__init__(config)
        self.model = TinyTransformer(config.spec(), [AttentionGene.parse(key) for key in config.genes])
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        check_files(os.fspath(pretrained_model_name_or_path), kwargs)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    def save_pretrained(self, save_directory, *args, **kwargs):
        # the checksums are those of the exported files; transformers writes its own
        exported = getattr(self.config, "evo_attention", None)
        if isinstance(exported, dict) and "files" in exported:
            self.config.evo_attention = {{k: v for k, v in exported.items() if k != "files"}}
        return super().save_pretrained(save_directory, *args, **kwargs)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # past_key_values is an EvoAttentionCache (the library's caches), made by forward

    def get_input_embeddings(self):
        return self.model.tok_emb

    def get_output_embeddings(self):
        return self.model.head

    def _init_weights(self, module):
        """The weights come from the library's initialisation (TinyTransformer's constructor) or from
        the checkpoint: nothing is drawn here. Only the library's non-persistent buffers (rotary
        frequencies, ALiBi slopes, temperatures), which no checkpoint holds and which transformers
        leaves unset when it builds the model on the meta device, are computed again, by the
        library's own constructor."""
        if not module._non_persistent_buffers_set:
            return
        name = next(n for n, m in self.named_modules() if m is module)
        parts = name.split(".")[1:]  # inside self.model
        with torch.random.fork_rng(devices=[]), torch.device("cpu"):
            if parts[:1] == ["blocks"]:  # one fresh layer is enough
                fresh = Block(self.model.spec, self.model.genes[int(parts[1])]).get_submodule(".".join(parts[2:]))
            else:
                fresh = TinyTransformer(self.model.spec, self.model.genes).get_submodule(".".join(parts))
        for buffer in module._non_persistent_buffers_set:
            getattr(module, buffer).copy_(fresh.get_buffer(buffer))

    def _get_stopping_criteria(self, generation_config, *args, **kwargs):
        """transformers' criteria, and without a cache a stop at the window: the model recomputes
        the whole sequence each step and sees at most ``max_seq_len`` positions (with the cache the
        window slides instead)."""
        criteria = super()._get_stopping_criteria(generation_config, *args, **kwargs)
        if not generation_config.use_cache:
            criteria.append(MaxLengthCriteria(max_length=self.model.spec.max_seq_len))
        return criteria

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, labels=None, use_cache=None,
                return_dict=None, **kwargs):
        if input_ids is None:
            raise ValueError("{model_class} reads input_ids (inputs_embeds are not supported)")
        # transformers >= 5.24 passes the cache as ``cache`` (``past_key_values`` before)
        past_key_values = past_key_values if past_key_values is not None else kwargs.get("cache")
        cached = past_key_values is not None or bool(use_cache)
        window = self.model.spec.max_seq_len
        if not cached and input_ids.shape[1] > window:
            raise ValueError(f"{{input_ids.shape[1]}} positions are more than the model's window of {{window}}: "
                             "crop the input, or generate with use_cache=True (the window slides)")
        # id vocab_size is the tokenizer's padding token, which no text gives: never embedded. Without a
        # mask, padding before a row's tokens is read from it; after them (or where a mask leaves it in)
        # it is what generate appends to a finished row, whose logits nothing reads.
        pads = input_ids == self.model.spec.vocab_size
        if attention_mask is None and bool((pads[:, :-1] & ~pads[:, 1:]).any()):
            attention_mask = (~pads).long()
        input_ids = input_ids.masked_fill(pads, 0)
        real = _padding(attention_mask, input_ids.shape[1], cached)
        if cached and past_key_values is None:
            past_key_values = EvoAttentionCache(self.model, rows=None if real is None else input_ids.shape[0])
        if real is None and past_key_values is not None and past_key_values.rows is not None:
            real = torch.ones_like(input_ids, dtype=torch.bool)
        if real is not None:  # left padding: each row runs alone on its real tokens (the same numbers as alone)
            logits = None
            for row in range(input_ids.shape[0]):
                keep = real[row]
                ids = input_ids[row:row + 1, keep]
                if ids.shape[1] == 0:
                    continue
                if cached:
                    out = past_key_values.rows[row].extend(self.model, ids)
                else:
                    out = self.model(ids)
                if logits is None:
                    logits = out.new_zeros(*input_ids.shape, out.shape[-1])
                logits[row, keep] = out[0]
            if cached:
                past_key_values.length += input_ids.shape[1]
        elif cached:
            logits = past_key_values.extend(self.model, input_ids)
        else:
            logits = self.model(input_ids)
        loss = None
        if labels is not None:  # the next token's loss, as transformers' causal models compute it; no pad is scored
            targets = labels[:, 1:].masked_fill(labels[:, 1:] == self.model.spec.vocab_size, -100)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
        output = CausalLMOutputWithPast(loss=loss, logits=logits, **{{_CACHE_FIELD: past_key_values}})
        return output if return_dict is not False else output.to_tuple()
'''


# -- the tokenizer ------------------------------------------------------------------------------
def hf_tokenizer(tokenizer: Tokenizer) -> tuple[str, dict]:
    """``(tokenizer.json text, tokenizer_config.json entries)``: ``tokenizer`` as a ``tokenizers``
    fast tokenizer giving the same ids (see the module docstring)."""
    try:
        import tokenizers as tk
    except ImportError:
        raise UserError("export --format hf needs Hugging Face tokenizers: pip install tokenizers") from None
    tokenizer = as_tokenizer(tokenizer)
    special: dict[str, str] = {}
    if isinstance(tokenizer, WordTokenizer) and tokenizer.vocab.eos_id is None:
        # a generated task's symbols (recall, mqar, the MAD tasks): words split on whitespace, id 0 the
        # task's filler (its targets never scored)
        vocab = tokenizer.vocab
        model = tk.Tokenizer(tk.models.WordLevel(dict(vocab.stoi), unk_token=UNK if UNK in vocab.stoi else None))
        model.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
        model.decoder = tk.decoders.Sequence([tk.decoders.WordPiece(prefix=" ", cleanup=False), tk.decoders.Fuse()])
        pad = vocab.itos[0]
        model.add_special_tokens([tk.AddedToken(pad, single_word=True, normalized=False, special=True)])
        # ... and the beginning-of-sequence token: a harness (lm-evaluation-harness) reads it as the
        # prefix of an empty context and fails without one; no template adds it to encoded text
        special.update(bos_token=pad)
    elif isinstance(tokenizer, WordTokenizer):
        vocab = tokenizer.vocab
        model = tk.Tokenizer(tk.models.WordLevel(dict(vocab.stoi), unk_token=UNK))
        # the corpus recipe's lines: \\r\\n, \\r and \\n end a line, each becoming an <eos> word; the other
        # characters Python's str.split() splits on but Unicode's White_Space lacks become spaces
        model.normalizer = tk.normalizers.Sequence([
            tk.normalizers.Replace("\r\n", "\n"), tk.normalizers.Replace("\r", "\n"),
            tk.normalizers.Replace(tk.Regex("[\x1c-\x1f]"), " "), tk.normalizers.Replace("\n", f" {EOS} ")])
        model.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
        # the library's decode: the words joined by spaces, <eos> read as a newline
        model.decoder = tk.decoders.Sequence([
            tk.decoders.WordPiece(prefix=" ", cleanup=False), tk.decoders.Fuse(),
            tk.decoders.Replace(f" {EOS} ", "\n"), tk.decoders.Replace(EOS, "\n")])
        # <eos> is the end-of-sequence token transformers knows
        model.add_special_tokens([tk.AddedToken(EOS, single_word=True, normalized=False, special=True)])
        special.update(eos_token=EOS)
    elif isinstance(tokenizer, CharTokenizer):  # a BPE model without merges: one token per character
        model = tk.Tokenizer(tk.models.BPE({c: i for i, c in enumerate(tokenizer.itos)}, [], unk_token=UNK))
        model.decoder = tk.decoders.Sequence([tk.decoders.Replace(UNK, "\ufffd"), tk.decoders.Fuse()])  # as decode
    elif isinstance(tokenizer, ByteTokenizer):  # the byte-level alphabet, one token per byte
        model = tk.Tokenizer(tk.models.BPE({c: b for c, b in byte_alphabet().items()}, []))
        model.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        model.decoder = tk.decoders.ByteLevel()
    elif isinstance(tokenizer, BPETokenizer):
        model = tokenizer.model
    else:
        raise UserError(f"cannot export a {type(tokenizer).__name__} tokenizer: export handles "
                        "word, char, byte and bpe tokenizers")
    # The padding token is one of its own, id vocab_size (after the vocabulary, which the model never
    # embeds), so transformers never reads a real token as padding (it infers a mask from input_ids !=
    # pad_token_id); split_special_tokens reads a special token's text as text, so no text gives it.
    words, pad = model.get_vocab(), "<pad>"
    while pad in words:
        pad = f"<{pad}>"
    saved = json.loads(model.to_str())
    saved["added_tokens"].append({"id": tokenizer.vocab_size, "content": pad, "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": True})
    return json.dumps(saved, ensure_ascii=False), {**special, "pad_token": pad, "split_special_tokens": True}


# -- the export's files -------------------------------------------------------------------------
def _imports(modules: list[str]) -> str:
    return "\n".join(f"from .{m} import __name__ as _{m}" for m in modules)


def _plugin_listing(names: list[str]) -> str:
    if not names:
        return ""
    return ("\n# The plugins whose ops and components the genes use (the plugin's module, its imports of the library\n"
            "# made relative), imported here so that their registrations run before a model is built.\n"
            f"{_imports(names)}\nPLUGIN_MODULES = ({''.join(f'_{m}, ' for m in names).rstrip()})\n")


def model_sources(plugins=()) -> dict[str, str]:
    """The python files of an HF export: {file name: text}, the configuration and modeling files
    and the library's modules they run (flat), with the modules of ``plugins`` (``check_exportable``)."""
    shipped = module_sources(MODEL_ROOTS, flat=True, plugins=plugins)
    plugin_modules = plugin_names(plugins, flat=True)
    modules = [path[:-3] for path in shipped if path[:-3] not in plugin_modules]
    fill = dict(version=__version__, config_class=CONFIG_CLASS, model_class=MODEL_CLASS, model_type=MODEL_TYPE,
                config_module=CONFIG_MODULE, spec_module=flat_name("evo_attention.nn.spec"),
                genes_module=flat_name("evo_attention.genes"), model_module=flat_name("evo_attention.nn.model"),
                listing=_imports(modules), names="".join(f"\n    _{m}," for m in modules) + "\n",
                plugins=_plugin_listing(plugin_modules))
    return {f"{CONFIG_MODULE}.py": _CONFIGURATION.format(**fill), f"{MODELING_MODULE}.py": _MODELING.format(**fill),
            **shipped}


def _config(directory: str | Path) -> dict:
    """The directory's config.json, or {} where it has none that reads as a mapping."""
    try:
        config = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def is_hf_export(directory: str | Path) -> bool:
    """Whether ``directory`` is an export of this format (its config.json names ``MODEL_TYPE``)."""
    return _config(directory).get("model_type") == MODEL_TYPE


register_output_kind("a transformers export", is_hf_export)


def hf_config(model, *, source: str = "", extra: dict | None = None) -> dict:
    """config.json of the export (what ``EvoAttentionConfig.to_dict`` holds, written without transformers)."""
    spec = ModelSpec.from_mapping(model.spec.to_dict())
    return {
        "architectures": [MODEL_CLASS],
        "auto_map": {"AutoConfig": f"{CONFIG_MODULE}.{CONFIG_CLASS}",
                     "AutoModelForCausalLM": f"{MODELING_MODULE}.{MODEL_CLASS}"},
        "model_type": MODEL_TYPE,
        "genes": [g.key for g in model.genes],
        **spec.to_dict(),
        "tie_word_embeddings": True,
        "dtype": "float32",
        "evo_attention": {"version": __version__, **({"source": source} if source else {}), **dict(extra or {})},
    }


def _state(model) -> dict:
    state = {}
    for key, tensor in model.state_dict().items():
        if key != "head.weight":  # tied to tok_emb.weight: stored once, tied again on loading
            tensor = tensor.detach().cpu()
            state[PREFIX + key] = (tensor.float() if tensor.is_floating_point() else tensor).contiguous()
    return state


_README = """# evo-attention model `{genes}`

{source}A causal language model whose attention was found by evo-attention {version}, exported with
`evo-attention export --format hf`. The code that runs is the library's own (`evo_attention_*.py`:
its modules, their imports made relative), wrapped for `transformers` in `{modeling}.py`.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("DIR", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("DIR", trust_remote_code=True)
ids = tokenizer("some text", return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=20, do_sample=False)
print(tokenizer.decode(out[0]))
```

| setting | value |
| --- | --- |
| block | {block} |
| d_model, n_heads, n_layers | {d_model}, {n_heads}, {n_layers} |
| window (max_seq_len) | {max_seq_len} positions |
| vocabulary | {vocab_size} tokens ({tokenizer}) |
| genes (per layer) | {gene_list} |

It sees at most {max_seq_len} positions (generation slides the window past that); `generate` runs the
library's cached decoding (keys and values, or a kernel normalization's running sums). Batches are
padded on the left for `generate` (`tokenizer.padding_side = "left"`: each row runs on its real
tokens); a batch padded on the right is scored without a cache, and generating from it is refused.

{needs}
"""


def export_hf(model, tokenizer, out: str | Path, *, source: str = "", extra: dict | None = None) -> dict:
    """Write ``model`` (a ``TinyTransformer``) and its ``tokenizer`` (a library ``Tokenizer`` or a
    ``Vocab``) to ``out`` as a transformers model directory (see the module docstring). Everything
    is checked and built before anything is written. Returns ``{"genes", "files", "layers"}``."""
    from safetensors.torch import save

    if tokenizer is None:
        raise UserError("no tokenizer (the model directory has no tokenizer.json): an HF export needs the tokenizer "
                        "the model was trained with")
    plugins = check_exportable(model.genes)
    tokenizer = as_tokenizer(tokenizer)
    if tokenizer.vocab_size != model.spec.vocab_size:
        raise UserError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model {model.spec.vocab_size}: "
                        "export the tokenizer the model was trained with")
    tokenizer_json, special = hf_tokenizer(tokenizer)
    sources = model_sources(plugins)
    config = hf_config(model, source=source, extra=extra)
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model.spec.max_seq_len,
                        "clean_up_tokenization_spaces": False, **special,
                        "model_input_names": ["input_ids", "attention_mask"]}  # no token_type_ids for generate
    weights = save(_state(model), metadata={"format": "pt"})
    spec = ModelSpec.from_mapping(config)
    genes = list(dict.fromkeys(config["genes"]))
    readme = _README.format(
        genes=genes[0] if len(genes) == 1 else f"{len(genes)} genes", source=f"From {source}. " if source else "",
        version=__version__, modeling=MODELING_MODULE, block=spec.block, d_model=spec.d_model, n_heads=spec.n_heads,
        n_layers=spec.n_layers, max_seq_len=spec.max_seq_len, vocab_size=spec.vocab_size, tokenizer=tokenizer.spec,
        gene_list="; ".join("`" + g.replace("|", "\\|") + "`" for g in config["genes"]),  # a table cell
        needs=textwrap.fill("Needs " + ", ".join(requirements(sources)) + ".", 100, break_on_hyphens=False))
    files = {**sources, "tokenizer.json": tokenizer_json,
             "tokenizer_config.json": json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n",
             "README.md": readme}
    out = output_dir(check_output(out, kind="a transformers export", own=is_hf_export,
                                  writes=[*files, "config.json", WEIGHTS_FILE, *LM_EVAL_FILES]))
    earlier = _config(out)  # is_hf_export's reading, once
    if earlier.get("model_type") == MODEL_TYPE:  # an earlier export: its files that this one does not write go
        own = earlier.get("evo_attention")
        listed = own.get("files") if isinstance(own, dict) else None
        for name in {*(listed if isinstance(listed, dict) else ()), *LM_EVAL_FILES} - {*files, WEIGHTS_FILE}:
            if Path(name).name == name and name not in (".", "..") and (out / name).is_file():  # an export's own
                (out / name).unlink()
    # the sha256 of every other file, checked when the model loads (``check_files`` of the modeling file)
    config["evo_attention"]["files"] = {**{name: sha256(text.encode("utf-8")) for name, text in files.items()},
                                        WEIGHTS_FILE: sha256(weights)}
    files["config.json"] = json.dumps(config, indent=2) + "\n"
    written = [str(write_text(out / name, text)) for name, text in files.items()]
    written.append(str(write_bytes(out / WEIGHTS_FILE, weights)))
    return {"genes": config["genes"], "files": sorted(written), "layers": len(model.genes)}


# -- an lm-evaluation-harness task for the data the model was trained on ------------------------------
LM_EVAL_TASK = "lm_eval_task.yaml"
LM_EVAL_DOCS = "lm_eval_{split}.jsonl"
LM_EVAL_FILES = (LM_EVAL_TASK, *(LM_EVAL_DOCS.format(split=split) for split in ("valid", "test")))

_TASK_YAML = """# An lm-evaluation-harness task (written by `evo-attention export --format hf`): the {split} split
# of {data}, which the model was trained on. Run it with
#   lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True --tasks {name} --include_path DIR
# (the data file's path below is where the export wrote it: export again after moving the directory).
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    {split}: {docs}
output_type: {output_type}
test_split: {split}
doc_to_text: {doc_to_text}
doc_to_target: {doc_to_target}
target_delimiter: " "
metric_list:
{metrics}"""


def lm_eval_documents(data, tokenizer, split: str) -> tuple[str, list[dict]]:
    """``(output_type, documents)`` of the harness task for ``split`` of ``data``: a generated task
    (``ExampleData``: recall, mqar, the MAD tasks) gives one ``loglikelihood`` document per scored
    target (``context``: the example up to it, ``target``: the token to predict), so the harness's
    ``acc`` and ``perplexity`` are the library's accuracy and perplexity; a corpus gives the split's
    text as one ``loglikelihood_rolling`` document (its every token scored, as the library scores it)."""
    from evo_attention.data.base import IGNORE_INDEX, ExampleData

    tokenizer = as_tokenizer(tokenizer)
    split = data.check_split(split)
    if isinstance(data, ExampleData):
        x, y = data.data[split]
        scored = [(row, t) for row in range(len(x)) for t in (y[row] != IGNORE_INDEX).nonzero().flatten().tolist()]
        return "loglikelihood", [{"context": tokenizer.decode(x[row, :t + 1].tolist()),
                                  "target": tokenizer.decode([int(y[row, t])])} for row, t in scored]
    streams = getattr(data, "streams", None)
    if streams is None:
        raise UserError(f"no lm-evaluation-harness task for the {data.name!r} data: it holds neither examples nor "
                        "a token stream")
    return "loglikelihood_rolling", [{"text": tokenizer.decode(streams[split].tolist())}]


def write_lm_eval_task(data, tokenizer, split: str, out: str | Path) -> tuple[str, list[str]]:
    """Write ``lm_eval_task.yaml`` and its documents (``lm_eval_<split>.jsonl``) into ``out`` (see
    ``lm_eval_documents``); returns the task's name and the paths written."""
    output_type, docs = lm_eval_documents(data, tokenizer, split)
    out = Path(out).resolve()
    name = f"evo_attention_{''.join(c if c.isalnum() else '_' for c in str(data.name))}_{split}"
    docs_path = out / LM_EVAL_DOCS.format(split=split)
    # the target follows its context after a space, which the target itself carries: harness versions
    # differ in whether they put the delimiter between them (an extra space splits the same words)
    if output_type == "loglikelihood":
        fields = dict(doc_to_text='"{{context}}"', doc_to_target='" {{target}}"',
                      metrics="  - metric: acc\n  - metric: perplexity\n")
    else:
        fields = dict(doc_to_text='""', doc_to_target='"{{text}}"',
                      metrics="  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n")
    yaml = _TASK_YAML.format(name=name, split=split, data=data.name, docs=json.dumps(str(docs_path)),
                             output_type=output_type, **fields)
    lines = "".join(json.dumps(doc, ensure_ascii=False) + "\n" for doc in docs)
    return name, [str(write_text(docs_path, lines)), str(write_text(out / LM_EVAL_TASK, yaml))]
