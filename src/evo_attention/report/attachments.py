"""What the studies leave in a run directory, and how the report finds it (``load_attachments``).

The file names are defined here once (each study's ``.json`` beside its ``.md`` and figure, ``_test`` for the
test split; the places each is looked for), so the report never needs the studies' code.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

COMPARE_RESULTS, COMPARE_TABLE, COMPARE_FIGURE = "compare_results.json", "compare.md", "compare.png"
MAPS_FILE = "attention_maps.json"
CURVE_RESULTS, CURVE_TABLE, CURVE_FIGURE = "curve.json", "curve.md", "curve.png"
VALIDATION_FILES = ("validation.json", "validation_test.json")
ABLATION_FILES = ("ablation.json", "ablation_test.json")
TRANSFER_FILES = ("transfer.json", "transfer_test.json")
COMPARE_FILES = (COMPARE_RESULTS, f"compare/{COMPARE_RESULTS}")
FRESH_CHECK_FILE = "fresh_check.json"  # a search's fresh-seed check of its top genes (studies.fresh_check)
FRESH_CHECK_ROLE = "check"  # the role a search's fresh-seed check stores its trainings with
CHECK_PENDING = "fresh_check_pending"  # the store's meta while a finished search's fresh-seed check has not ended
CURVE_DIRS = (".", "curve")  # where the report looks for a curve (its figure lies beside it)
SUITE_FILES = ("validation_suite.json", "validation_suite_test.json", "compare_suite.json", "compare_suite_test.json",
               "compare/compare_suite.json", "compare/compare_suite_test.json")
COMPARE_KEYS = ("name", "gene", "seed", "val_loss", "val_perplexity", "accuracy", "time_s", "peak_memory_mb",
                "params", "status")


def output_stem(kind: str, eval_split: str) -> str:
    """``validation`` for the validation split, ``validation_test`` for the test split (any ``kind``)."""
    return kind if eval_split == "valid" else f"{kind}_{eval_split}"


@dataclass
class Attachments:
    """The analysis results beside a run's store as plain dicts, each file's with ``"_file"`` (its path relative
    to the run directory): ``validations``, ``ablations``, ``transfers``, ``suites``, ``fresh_check``; ``compare``:
    the rows of ``compare_results.json`` (every key of ``COMPARE_KEYS``, None where missing); ``curves`` and
    ``maps`` with ``"_dir"``, the directory their figures lie in; ``problems``: one line per file that exists
    but could not be read (the report says so instead of failing)."""

    validations: list[dict] = field(default_factory=list)
    ablations: list[dict] = field(default_factory=list)
    transfers: list[dict] = field(default_factory=list)
    compare: list[dict] | None = None
    curves: list[dict] = field(default_factory=list)
    maps: list[dict] = field(default_factory=list)
    suites: list[dict] = field(default_factory=list)
    fresh_check: dict | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def validation(self) -> dict | None:
        """The validation on the validation split (else the first one found)."""
        return next((v for v in self.validations if v.get("eval_split") == "valid"),
                    self.validations[0] if self.validations else None)


def _read_json(path: Path, problems: list[str]) -> Any:
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        problems.append(f"{path.name}: cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
        return None


def _compare_rows(data: Any, path: Path, problems: list[str]) -> list[dict] | None:
    results = data.get("results") if isinstance(data, Mapping) else None
    if not isinstance(results, list):
        problems.append(f"{path.name}: has no 'results' list")
        return None
    return [{key: row.get(key) for key in COMPARE_KEYS} for row in results if isinstance(row, Mapping)]


def load_attachments(run_dir: str | os.PathLike) -> Attachments:
    """Every analysis result in ``run_dir`` (and ``maps``, ``maps/*``, ``curve`` in it)."""
    run_dir = Path(run_dir)
    found = Attachments()

    def read(name: str, what: str, kind: str | None = None) -> Mapping | None:
        """The ``kind`` result (none: attention maps, with a ``layers`` list) in the file ``name`` with ``"_file"``;
        None where there is no such file, or it is not ``what`` (said in ``problems``)."""
        data = _read_json(run_dir / name, found.problems) if (run_dir / name).is_file() else None
        if isinstance(data, Mapping) and (data.get("kind") == kind if kind else isinstance(data.get("layers"), list)):
            return {**data, "_file": name}
        if data is not None:
            found.problems.append(f"{name}: not {what}")
        return None

    for names, target, kind in ((VALIDATION_FILES, found.validations, "validation"),
                                (ABLATION_FILES, found.ablations, "ablation"),
                                (TRANSFER_FILES, found.transfers, "transfer"),
                                (SUITE_FILES, found.suites, "suite")):
        target += [data for name in names if (data := read(name, f"a {kind} result", kind))]
    found.fresh_check = read(FRESH_CHECK_FILE, "a fresh-seed check", "fresh_check")
    for name in COMPARE_FILES:
        path = run_dir / name
        if path.is_file():
            data = _read_json(path, found.problems)
            if data is not None:
                found.compare = _compare_rows(data, path, found.problems)
            break
    found.curves = [{**data, "_dir": where} for where in CURVE_DIRS
                    if (data := read(str(Path(where) / CURVE_RESULTS), "a curve result", "curve"))]
    candidates = [run_dir, run_dir / "maps"]
    if (run_dir / "maps").is_dir():
        candidates += sorted(p for p in (run_dir / "maps").iterdir() if p.is_dir())
    for where in (str(directory.relative_to(run_dir)) for directory in candidates):  # "." for run_dir itself
        if data := read(str(Path(where) / MAPS_FILE), "an attention-maps result"):
            found.maps.append({**data, "_dir": where})
    return found
