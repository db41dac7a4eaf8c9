"""JSON in the project's two uses, with one encoder.

- Outputs (``final_results.json``, study results, ``--json``): strict JSON where a non-finite
  float is ``null`` (a reader in any language gets "no value"), ``dumps`` / ``write_json``.
- The run store (``store_dumps`` / ``store_loads``): a non-finite float is written as the string
  ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` and read back as that float, so a diverged loss
  survives a round trip. The text stays standard JSON. Caveat: a string value that is exactly one
  of those three spellings also reads back as a float.

Both walk the value the same way (``to_jsonable``; sets sorted, so the text is stable).
"""

from __future__ import annotations

import enum
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

from evo_attention.util.files import write_text

_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def to_jsonable(obj: Any, *, nonfinite: str = "null", strict: bool = False) -> Any:
    """``obj`` as plain JSON values. ``nonfinite``: ``"null"`` (outputs) or ``"string"`` (the store).

    An object of another type becomes ``str(obj)``, or with ``strict`` raises TypeError.
    """
    def walk(value: Any) -> Any:
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            if nonfinite == "null":
                return None
            return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        if isinstance(value, enum.Enum):
            return walk(value.value)
        if value is None or isinstance(value, (str, bool, int)):
            return value
        if isinstance(value, Mapping):
            return {str(k): walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        if isinstance(value, (set, frozenset)):
            return [walk(v) for v in sorted(value, key=repr)]
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
            return walk(value.tolist())
        if callable(getattr(value, "to_dict", None)):  # evaluation records, configs
            return walk(value.to_dict())
        if isinstance(getattr(value, "key", None), str):  # an AttentionGene
            return value.key
        if strict:
            raise TypeError(f"cannot store a value of type {type(value).__name__} as JSON: {value!r}")
        return str(value)

    return walk(obj)


def dumps(obj: Any) -> str:
    """Strict, indented JSON text for an output file (non-finite floats as null)."""
    return json.dumps(to_jsonable(obj), indent=2, allow_nan=False)


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``dumps(obj)`` to ``path`` atomically."""
    return write_text(path, dumps(obj) + "\n")


def _decoded(value: Any) -> Any:
    if isinstance(value, str):
        return _NONFINITE.get(value, value)
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    if isinstance(value, dict):
        return {k: _decoded(v) for k, v in value.items()}
    return value


def store_dumps(value: Any) -> str:
    """Compact JSON text for the run store (non-finite floats as strings; unknown types refused)."""
    return json.dumps(to_jsonable(value, nonfinite="string", strict=True), allow_nan=False)


def store_loads(text: str) -> Any:
    """Inverse of ``store_dumps``."""
    return _decoded(json.loads(text))
