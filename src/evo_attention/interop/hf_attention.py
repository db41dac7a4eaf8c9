"""A gene as a transformers attention function: ``attn_implementation=NAME`` in Llama-family and
GPT-2 models (``export --format hf-attention``).

transformers' attention layers project the hidden states to q, k, v (and rotate them, in Llama)
and hand them to a function looked up by ``config._attn_implementation`` in its
``AttentionInterface``; the layer then applies its output projection. Here::

    register(NAME)                      # AttentionInterface.register (and the mask interface's sdpa form)
    model = LlamaForCausalLM(config)    # config._attn_implementation = NAME (or attn_implementation=NAME)
    install(model, gene)                # the gene's own parameters into every attention layer, checked

``install`` gives every attention layer of the host a submodule ``evo_attention``: the library's
``EvolvedAttention`` of the gene without its projections (the host's take their place), holding
the gene's own parameters, which train, save and load with the host's. Two module hooks on the layer
give the gene the layer's input x: the input gate (``gating.gate_input``) before the host's
projections, the output gating (``gating(x, y)``) after its output projection.

Contract:

- One implementation: ``attention_forward`` runs the gene's program (``ProgramCore.heads``) on the
  host's q, k, v, on a whole sequence with the paths the tool trains with, and on new positions after
  the host's cache with the rows of its decoding (a ``cacheable`` program; for others ``install`` sets
  ``generation_config.use_cache = False`` and a cached call is refused in one line). On the same
  weights it computes what the library's ``EvolvedAttention`` computes (a test compares, fp32, 1e-5).
- What the host decides: the projections (its ``qkv_rank``, ``kv_heads``, bias), and the word order
  of rotary or learned positions (Llama rotates q and k itself, GPT-2 adds learned positions to
  its input); the gene decides the rest, its window and score biases (ALiBi, ``abias=rel``)
  included. The host's ``scaling`` is not used: the gene's similarity scales its scores.
- Causal by construction (``causal_mask`` / ``decode_mask``, combined with the host's padding mask,
  never replaced by it); ``install`` refuses a layer that is not causal and checks on the installed
  layer that no output reads a later position. A left-padded row of a program that reads along time
  runs on its own positions (``ProgramCore.padding``): each row gives what it gives alone.
- Needs transformers only to register (imported there); the rest is PyTorch.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
import torch.nn as nn

from evo_attention.genes import AttentionGene, canonical_program
from evo_attention.nn import components
from evo_attention.nn.attention import EvolvedAttention, decode_mask
from evo_attention.util.errors import UserError
from evo_attention.util.files import check_output, output_dir, register_output_kind, write_text
from evo_attention.util.version import __version__

ATTRIBUTE = "evo_attention"  # the submodule of a host attention layer holding the gene's parameters
DEFAULT_NAME = "evo_attention"
_INPUT = "_evo_attention_input"  # the layer's input x while the layer runs (set by the hooks)


def core_attention(gene: AttentionGene | str, d_model: int, n_heads: int, *, max_seq_len: int | None = None,
                   kernel_features: int = 64) -> EvolvedAttention:
    """The library's ``EvolvedAttention`` of ``gene`` without what the host brings: its Q/K/V and
    output projections (removed) and its rotary embedding (the host's positions); grouped K/V
    heads and a low-rank projection are the host's too."""
    gene = AttentionGene.parse(gene) if isinstance(gene, str) else gene
    if gene.program is not None and not canonical_program(gene.program).text.startswith("o("):
        raise UserError(f"program {gene.program} does more after its heads' output projection o(...): a "
                        "transformers layer applies its own output projection, so only a program o(...) can be hosted")
    core = EvolvedAttention(d_model, n_heads, gene.replace(kv_heads=0, qkv_rank=0), max_seq_len=max_seq_len,
                            kernel_features=kernel_features)
    del core.qkv, core.out
    core.rotary = None
    return core


def attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **kwargs):
    """The ``AttentionInterface`` function: q [B, H, T, d], k and v [B, K, S, d] (S - T positions
    from the host's cache before these) -> ([B, T, H, d], the weights or None)."""
    core = getattr(module, ATTRIBUTE, None)
    x = getattr(module, _INPUT, None)
    if core is None or x is None:
        raise ValueError(f"{type(module).__name__} has no evo-attention gene: call install(model, gene) after "
                         "building the model")
    t, s = query.shape[2], key.shape[2]
    if key.shape[1] != query.shape[1]:  # grouped K/V heads: each serves its group of query heads
        group = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    allowed = _allowed(attention_mask, query.shape[0], t, s)
    start = s - t
    if start and not cacheable(core):
        raise ValueError(f"gene {core.gene.key} reads other positions' queries or inputs (an op along time or "
                         "across positions, a convolution, or an op that may read x on keys or values), which the "
                         "host's cache does not keep: generate with use_cache=False")
    # the gene's gates run on the whole padded input (the hooks), each row's attention on its own positions
    if f"g.{core.gene.gating}" in components.ACROSS_POSITIONS and core.program.padding(core, allowed, len(x), t):
        raise ValueError(f"gating {core.gene.gating} of gene {core.gene.key} reads other positions' inputs, the "
                         "padding before a row's tokens included: pass unpadded rows one at a time")
    y = core.program.heads(core, x, {"q": query, "k": key, "v": value}, allowed, start)
    return y.transpose(1, 2).contiguous(), None


def _allowed(mask: torch.Tensor | None, b: int, t: int, s: int) -> torch.Tensor | None:
    """The host's mask as bool [B, 1, T, S] (True = may attend), or None when it allows every key
    the causal mask allows. The causal mask is the gene's own: this only adds padding."""
    if mask is None:
        return None
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    allowed = allowed[..., -t:, -s:].expand(b, -1, t, s)
    causal_only = bool((allowed | ~decode_mask(s - t, t, mask.device)).all())
    return None if causal_only else allowed


def _before(module, args, kwargs):
    x = args[0] if args else kwargs["hidden_states"]
    setattr(module, _INPUT, x)
    h = getattr(module, ATTRIBUTE).gating.gate_input(x)
    if h is x:
        return None
    if args:
        return (h,) + tuple(args[1:]), kwargs
    return args, {**kwargs, "hidden_states": h}


def _after(module, args, kwargs, output):
    x = module.__dict__.pop(_INPUT)
    gating = getattr(module, ATTRIBUTE).gating
    if isinstance(output, tuple):
        return (gating(x, output[0]),) + output[1:]
    return gating(x, output)


def attention_layers(model: nn.Module) -> list[nn.Module]:
    """The self-attention layers of a transformers model: the modules that call the attention
    interface (they hold ``layer_idx`` and ``is_causal``; Llama-family ``self_attn``, GPT-2 ``attn``)."""
    return [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "is_causal")
            and hasattr(m, "config") and m is not model]


def install(model: nn.Module, gene: AttentionGene | str | list, *, kernel_features: int = 64) -> list[nn.Module]:
    """Give every attention layer of ``model`` the gene's parameters and hooks (see the module
    docstring; ``gene`` may be one per layer) and check each layer's causality. Returns the
    layers. ValueError for a model this cannot host (no attention layer, a non-causal one, a
    head size other than hidden_size / heads)."""
    layers = attention_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no attention layer that calls the AttentionInterface")
    genes = list(gene) if isinstance(gene, (list, tuple)) else [gene] * len(layers)
    if len(genes) != len(layers):
        raise ValueError(f"{len(genes)} genes for {len(layers)} attention layers")
    config = model.config
    d_model, n_heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or d_model // n_heads
    if head_dim * n_heads != d_model:
        raise ValueError(f"head_dim {head_dim} x {n_heads} heads is not hidden_size {d_model}: the gene's "
                         "temperature and gates read the layer input of hidden_size")
    for layer, g in zip(layers, genes):
        if not layer.is_causal:
            raise ValueError(f"{type(layer).__name__} is not causal: an evolved attention is a causal "
                             "self-attention")
        try:
            core = core_attention(g, d_model, n_heads, max_seq_len=getattr(config, "max_position_embeddings", None),
                                  kernel_features=kernel_features)
        except UserError as exc:
            raise ValueError(str(exc)) from None
        layer.register_module(ATTRIBUTE, core.to(next(layer.parameters()).device))
        layer.register_forward_pre_hook(_before, with_kwargs=True)
        layer.register_forward_hook(_after, with_kwargs=True)
        check_causal(layer)
    generation = getattr(model, "generation_config", None)
    if generation is not None and not all(cacheable(getattr(layer, ATTRIBUTE)) for layer in layers):
        generation.use_cache = False  # so that a plain generate() recomputes each step instead of failing
    return layers


def cacheable(core: EvolvedAttention) -> bool:
    """Whether the host's KV cache holds all the gene reads when decoding (else: recompute)."""
    return core.qkv_conv is None and core.program.cacheable


def check_causal(layer: nn.Module, t: int = 6) -> None:
    """ValueError unless the function on ``layer``'s gene leaves every output unchanged when a
    later position's key, value and input change (the check ``install`` runs)."""
    core = getattr(layer, ATTRIBUTE)
    h, d = core.n_heads, core.d_head
    generator = torch.Generator().manual_seed(0)
    device = next(core.parameters(), torch.empty(0)).device

    def run(q, k, v, x):
        setattr(layer, _INPUT, x)
        try:
            with torch.no_grad():
                return attention_forward(layer, q, k, v, None)[0]
        finally:
            layer.__dict__.pop(_INPUT, None)

    q, k, v = (torch.randn(1, h, t, d, generator=generator).to(device) for _ in range(3))
    x = torch.randn(1, t, core.d_model, generator=generator).to(device)
    was = core.training
    core.eval()
    try:
        base = run(q, k, v, x)
        k2, v2, x2 = k.clone(), v.clone(), x.clone()
        k2[:, :, -1] += 1.0
        v2[:, :, -1] += 1.0
        x2[:, -1] += 1.0
        moved = run(q, k2, v2, x2)
    finally:
        core.train(was)
    if not torch.allclose(base[:, :-1], moved[:, :-1], atol=1e-6, rtol=0):
        raise ValueError(f"the attention of {core.gene.key} on {type(layer).__name__} reads later positions: it is "
                         "not causal")


def register(name: str = DEFAULT_NAME) -> str:
    """Register ``attention_forward`` as ``name`` in transformers' ``AttentionInterface`` (and
    ``name``'s mask as the sdpa form: a bool mask, or none where the causal mask says it all)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


# -- export --format hf-attention ---------------------------------------------------------------------
ENTRY_FILE = "hf_attention.py"
ROOTS = ("evo_attention.interop.hf_attention",)  # what the export ships (with every library module it imports)

_ENTRY = '''"""{genes_text}: an attention found by evo-attention, as a transformers attention function.

Made by `evo-attention export --format hf-attention`{source}. The code that runs is evo-attention
{version}'s own (`{package}/`: its modules, their package imports made relative). Use it in a
Llama-family or GPT-2 model built from a config::

    import hf_attention
    config = LlamaConfig(..., attn_implementation=hf_attention.register())   # or GPT2Config(...)
    model = LlamaForCausalLM(config)
    hf_attention.install(model)          # the gene's own parameters into every attention layer, checked causal

The host's projections and positions (Llama's rotary, GPT-2's learned) stay; the gene brings its
similarity, normalization, temperature, gating, window and score biases. Needs {needs}.
"""

import importlib
import importlib.util
import sys
from pathlib import Path

GENES = {genes!r}  # one per layer of the model it was found in
NAME = "{name}"  # the attn_implementation it registers as
KERNEL_FEATURES = {kernel_features}  # random features per head (normalization favor only)
PACKAGE = "{package}"  # the library's modules, beside this file
PLUGINS = {plugins!r}  # the plugin modules whose ops and components GENES use (in PACKAGE)


{loader}
_module = importlib.import_module(_import_package() + ".interop.hf_attention")
attention_forward = _module.attention_forward


def register(name=NAME):
    """Register the attention function in transformers' AttentionInterface; returns the name to
    pass as attn_implementation."""
    return _module.register(name)


def install(model, genes=None):
    """Give every attention layer of ``model`` the gene's parameters and hooks (the genes of
    GENES layer by layer when the model has as many layers, else the one gene they share)."""
    genes = list(genes or GENES)
    layers = _module.attention_layers(model)
    if len(genes) != len(layers):
        if len(set(genes)) != 1:
            raise ValueError(f"{{len(genes)}} different genes for {{len(layers)}} attention layers: pass genes=")
        genes = genes[:1] * len(layers)
    return _module.install(model, genes, kernel_features=KERNEL_FEATURES)
'''


def is_hf_attention_export(directory) -> bool:
    """Whether ``directory`` holds an export of this format (its ``hf_attention.py`` beside its package)."""
    from evo_attention.interop.export import PACKAGE

    return (Path(directory) / ENTRY_FILE).is_file() and (Path(directory) / PACKAGE).is_dir()


register_output_kind("a transformers attention export", is_hf_attention_export)


def export_hf_attention(model, out, *, source: str = "", genes=None, spec=None) -> dict:
    """Write ``hf_attention.py`` (the entry: ``register``, ``install``, the genes of ``model``'s
    layers) and the library's modules it runs (``evo_attention_export/``) into ``out``. The function
    needs no weights: without a ``model`` (None), ``genes`` (a genome's genes, one per layer or one)
    and the model's ``spec`` (``nn.spec.ModelSpec``) say the same. Everything is checked and built
    before anything is written. Returns ``{"genes", "name", "files"}``."""
    from evo_attention.interop.export import (PACKAGE, PACKAGE_LOADER, check_exportable, module_sources, plugin_names,
                                              requirements)

    if model is not None:
        genes, spec = model.genes, model.spec
    genes = [g.key for g in genes]
    if spec.short_conv:
        raise UserError(f"the model convolves each attention's input (short_conv {spec.short_conv}), which a "
                        "transformers layer's own projections would skip: export it with --format hf or standalone",
                        setting="short_conv")
    plugins = check_exportable([AttentionGene.parse(g) for g in genes])
    shipped = {f"{PACKAGE}/{path}": text for path, text in module_sources(ROOTS, plugins=plugins).items()}
    unique = list(dict.fromkeys(genes))
    name = "evo_" + hashlib.sha256("\n".join(genes).encode()).hexdigest()[:10]
    entry = _ENTRY.format(genes_text=unique[0] if len(unique) == 1 else f"{len(unique)} genes",
                          source=f" from {source}" if source else "", version=__version__, package=PACKAGE,
                          needs=", ".join(["transformers"] + requirements(shipped)), genes=genes, name=name,
                          kernel_features=spec.favor_features, loader=PACKAGE_LOADER,
                          plugins=tuple(plugin_names(plugins)))
    out = output_dir(check_output(out, kind="a transformers attention export", own=is_hf_attention_export,
                                  writes=(ENTRY_FILE, PACKAGE)))
    for path, text in {ENTRY_FILE: entry, **shipped}.items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        write_text(out / path, text)
    return {"genes": genes, "name": name, "files": [str(out / ENTRY_FILE), str(out / PACKAGE)]}
