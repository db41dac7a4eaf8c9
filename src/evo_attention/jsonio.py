"""Strict JSON for outputs: NaN and infinities become null, numpy/tensor scalars plain numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def to_jsonable(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):  # numpy arrays/scalars, torch tensors
        return to_jsonable(obj.tolist())
    if hasattr(obj, "key") and isinstance(getattr(obj, "key"), str):  # an AttentionGene
        return obj.key
    return str(obj)


def dumps(obj: Any) -> str:
    return json.dumps(to_jsonable(obj), indent=2, allow_nan=False)


def write_json(path: str | Path, obj: Any) -> Path:
    path = Path(path)
    path.write_text(dumps(obj) + "\n")
    return path
