"""A trained model as a directory, in the ``save_pretrained`` / ``from_pretrained`` layout:

    DIR/config.json          the per-layer genes, the settings, the sha256 of every other file
    DIR/model.safetensors    the weights (safetensors: never pickle)
    DIR/tokenizer.json       the vocabulary or tokenizer (``Tokenizer.to_json``), when the data had one

``save_pretrained(model, dir)`` writes one and ``from_pretrained(dir)`` loads it (``train.saving``
adds the training Config). config.json's ``config`` is the mapping the caller gives (the training
``Config``'s), else the model's ``ModelSpec``; the model is built from its ``ModelSpec`` fields.

Loading checks every file against the checksum ``config.json`` lists for it, so a missing, truncated,
swapped or edited file is a one-line error naming it, before any tensor is read.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Mapping

from evo_attention.nn.model import TinyTransformer
from evo_attention.nn.spec import ModelSpec
from evo_attention.util.errors import UserError
from evo_attention.util.files import write_directory

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
MODEL_TYPE = "evo_attention"  # config.json's model_type in the other format: a transformers export (interop.hf)
TOKENIZER = "tokenizer.json"
FORMAT = "evo-attention-model/2"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def model_files(model, *, tokenizer=None, settings: Mapping | None = None,
                extra: Mapping | None = None) -> dict[str, bytes]:
    """The files of ``model``'s directory as ``{name: bytes}`` (a worker process sends them to the
    driver). ``tokenizer``: a ``data.tokenizers.Tokenizer`` or a ``Vocab`` (saved as a word tokenizer),
    or None; ``settings``: config.json's ``config`` (holding every field of ``model.spec``; default: those)."""
    from safetensors.torch import save_model
    import tempfile

    from evo_attention.data.tokenizers import Tokenizer, WordTokenizer
    from evo_attention.data.vocab import Vocab

    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:  # safetensors drops the tied head's copy when saving a module
        save_model(model, str(Path(tmp) / WEIGHTS))
        files[WEIGHTS] = (Path(tmp) / WEIGHTS).read_bytes()
    if isinstance(tokenizer, Vocab):
        tokenizer = WordTokenizer(tokenizer)
    if tokenizer is not None:
        if not isinstance(tokenizer, Tokenizer):
            raise UserError(f"tokenizer must be a Tokenizer or a Vocab, got {type(tokenizer).__name__}")
        files[TOKENIZER] = tokenizer.to_json().encode("utf-8")
    meta = {
        "format": FORMAT,
        "genes": [g.key for g in model.genes],
        "config": dict(settings) if settings is not None else model.spec.to_dict(),
        "params": model.num_parameters(),
        "files": {name: {"sha256": sha256(data), "bytes": len(data)} for name, data in files.items()},
        **dict(extra or {}),
    }
    files[CONFIG] = (json.dumps(meta, indent=2, sort_keys=False) + "\n").encode("utf-8")
    return files


def save_pretrained(model, directory: str | Path, *, tokenizer=None, settings: Mapping | None = None,
                    extra: Mapping | None = None) -> Path:
    """Write ``model`` (and its tokenizer) to ``directory``, replacing it as a whole (``model_files``)."""
    return write_directory(directory, model_files(model, tokenizer=tokenizer, settings=settings, extra=extra))


def read_config(directory: str | Path, *, verify: bool = True) -> dict:
    """config.json of a model directory, every file it lists checked against its sha256 (UserError
    naming the file when one is missing, altered or unreadable)."""
    directory = Path(directory)
    path = directory / CONFIG
    if not directory.is_dir():
        raise UserError(f"no model directory {directory}: give a directory written by save_pretrained "
                        "(search --keep-models or baseline --save-model)")
    if not path.is_file():
        older = " (it holds model.json: save the model again with this version)" if (directory / "model.json").is_file() else ""
        raise UserError(f"{path} is missing{older}: a model directory holds {CONFIG}, {WEIGHTS} and {TOKENIZER}")
    def damaged(reason: str) -> UserError:
        return UserError(f"{path} is damaged ({reason.splitlines()[0][:160]}): restore the directory or save the "
                         "model again")

    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise damaged(str(exc)) from None
    if isinstance(meta, dict) and meta.get("model_type") == MODEL_TYPE:
        raise UserError(f"{directory} is a transformers export (export --format hf), not a model directory of "
                        "evo-attention: load it with transformers' AutoModelForCausalLM.from_pretrained("
                        f"{str(directory)!r}, trust_remote_code=True), or give the model directory it was exported from")
    if not isinstance(meta, dict) or not isinstance(meta.get("genes"), list) or \
            not isinstance(meta.get("config"), dict) or not isinstance(meta.get("files"), dict) or \
            WEIGHTS not in meta["files"]:
        raise damaged("not an evo-attention model config (genes, config and files expected)")
    if verify:
        for name, entry in meta["files"].items():
            check_file(directory, name, entry)
    return meta


def check_file(directory: Path, name: str, entry: Mapping) -> None:
    """UserError unless ``directory/name`` exists and has the sha256 that config.json lists."""
    path = Path(directory) / name
    if Path(name).name != name:
        raise UserError(f"{directory / CONFIG} lists a file outside the directory ({name!r}): restore config.json")
    if not path.is_file():
        raise UserError(f"{path} is missing: restore it or save the model again")
    expected = entry.get("sha256") if isinstance(entry, Mapping) else None
    if not isinstance(expected, str) or sha256(path.read_bytes()) != expected:
        raise UserError(f"{path} was altered or damaged (its sha256 differs from the one in {CONFIG}): restore it "
                        "or save the model again")


def from_pretrained(directory: str | Path, *, device: str = "cpu") -> TinyTransformer:
    """The ``TinyTransformer`` saved in ``directory`` (every file checked against config.json): built
    from its ``ModelSpec``, its weights loaded, in eval mode."""
    from safetensors.torch import load_model

    from evo_attention.genes import AttentionGene

    directory = Path(directory)
    meta = read_config(directory)
    try:
        genes = [AttentionGene.parse(k) for k in meta["genes"]]
        spec = ModelSpec.from_mapping(meta["config"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{directory / CONFIG} does not describe a model this version can build "
                        f"({str(exc).splitlines()[0][:200]}): save the model again") from None
    model = TinyTransformer(spec, genes)
    try:
        load_model(model, str(directory / WEIGHTS), device=str(device))
    except Exception as exc:  # safetensors' own errors, a size mismatch (RuntimeError)
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise UserError(f"{directory / WEIGHTS} does not match {CONFIG} ({reason}): save the model again") from None
    return model.to(device).eval()


def load_tokenizer(directory: str | Path):
    """The tokenizer saved with a model (checked against config.json), or None if it has none."""
    from evo_attention.data.tokenizers import tokenizer_from_json

    directory = Path(directory)
    meta = read_config(directory, verify=False)
    entry = meta["files"].get(TOKENIZER)
    if entry is None:
        return None
    check_file(directory, TOKENIZER, entry)
    try:
        return tokenizer_from_json((directory / TOKENIZER).read_text(encoding="utf-8"))
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{directory / TOKENIZER} is damaged ({str(exc).splitlines()[0][:160]}): save the model "
                        "again") from None
