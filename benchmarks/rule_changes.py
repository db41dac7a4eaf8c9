"""Study 2's committed verdicts re-read by the current verdict rule (docs/findings2.md, "Study 2's
verdicts under the exact-test rule").

    python benchmarks/rule_changes.py [docs/findings] [--out docs/findings/rule-changes.json]

Reads every committed result of study 2 that holds paired comparisons (validations, the suite
validation, the transfer ladder, the curve verdicts, the strategy comparison), recomputes each
family with ``util.stats.versus_reference`` from the per-seed values the file stores (its own
margin, Holm over the same family as the file), and prints one row per comparison: the verdict
the file states, the verdict now, the test that decides now with its p, and the one-line
'cannot decide' message where these seeds cannot reach alpha. Nothing is trained; with ``--out``
the rows are also written as JSON (the committed docs/findings/rule-changes.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evo_attention.util import stats

ROOT = Path(__file__).resolve().parents[1]


def _validation_families(path: Path, payload: dict):
    metric = payload.get("metric", "val_perplexity")
    base = (payload.get("baseline") or {}).get("values") or []
    values = {g["gene"]: g.get("values") or [] for g in payload.get("genes", [])}
    old = {g["gene"]: g for g in payload.get("genes", [])}
    yield (path, values, base, {}, metric in stats.LOG_SCALE_METRICS, payload.get("margin", stats.DEFAULT_MARGIN),
           payload.get("lower_is_better", True), old)


def _transfer_families(path: Path, payload: dict):
    sizes = payload.get("sizes") or []
    log = payload.get("metric", "val_perplexity") in stats.LOG_SCALE_METRICS
    for size in sizes:
        base = size["baseline"]["values"]
        values = {g["gene"]: g["values"] for g in size["genes"]}
        others = {f"{o['size']}:{g['gene']}": {"values": g["values"], "reference": o["baseline"]["values"]}
                  for o in sizes if o is not size for g in o["genes"]}
        yield (f"{path} at {size['size']}", values, base, others, log, payload.get("margin", stats.DEFAULT_MARGIN),
               payload.get("lower_is_better", True), {g["gene"]: g for g in size["genes"]})


def _curve_verdict_families(path: Path, payload: dict):
    ref = payload["reference"]
    values = {k: v for k, v in payload["values"].items() if k != ref}
    yield (path, values, payload["values"][ref], {}, False, payload["margin"], False, payload["comparisons"])


def _strategy_families(path: Path, payload: dict):
    ref = payload["reference"]
    lower = not str(payload.get("metric")).endswith("accuracy")
    values = {k: v for k, v in payload["means"].items() if k != ref}
    yield (path, values, payload["means"][ref], {}, lower, payload["margin"], lower, payload["comparisons"])


def families(root: Path):
    """Every family of paired comparisons in study 2's committed files under ``root``."""
    for path in sorted(root.rglob("*.json")):
        payload = json.loads(path.read_text())
        if not isinstance(payload, dict):
            continue
        rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        if payload.get("kind") in ("validation", "suite") and payload.get("genes"):
            yield from _validation_families(rel, payload)
        elif payload.get("kind") == "transfer":
            yield from _transfer_families(rel, payload)
        elif "comparisons" in payload and "values" in payload and "reference" in payload:
            yield from _curve_verdict_families(rel, payload)
        elif "comparisons" in payload and "means" in payload:
            yield from _strategy_families(rel, payload)


def rows(root: Path) -> list[dict]:
    out = []
    for where, values, base, others, log, margin, lower, old in families(root):
        now = stats.versus_reference(values, base, log=log, margin=margin, lower_is_better=lower, others=others)
        for gene, row in now.items():
            before = old.get(gene) or {}
            out.append({"file": str(where), "gene": gene, "n": row["n_pairs"], "before": before.get("verdict"),
                        "p_before": before.get("p_holm"), "now": row["verdict"], "test": row["test"],
                        "p_now": row["p_holm"], "p_t": row["p_t"], "note": row["cannot_decide"]})
    return out


def _p(value) -> str:
    return "-" if value is None else f"{value:.3g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Study 2's committed verdicts re-read by the current verdict rule.")
    parser.add_argument("root", type=Path, nargs="?", default=ROOT / "docs" / "findings",
                        help="the folder of study 2's result files (default: docs/findings)")
    parser.add_argument("--out", type=Path, help="also write every row here as JSON")
    args = parser.parse_args(argv)
    root, out = args.root, args.out
    if not root.is_dir():
        raise SystemExit(f"{root}: no such folder (study 2's result files: docs/findings)")
    found = rows(root)
    changed = [r for r in found if r["before"] != r["now"]]
    print("| File | Gene | Pairs | Verdict (file) | Holm p (file) | Verdict now | Test | Holm p now | Note |")
    print("| :--- | :--- | ---: | :--- | ---: | :--- | :--- | ---: | :--- |")
    for r in found:
        mark = "**" if r in changed else ""
        print(f"| {r['file']} | `{r['gene']}` | {r['n']} | {r['before']} | {_p(r['p_before'])} | "
              f"{mark}{r['now']}{mark} | {r['test']} | {_p(r['p_now'])} | {r['note'] or ''} |")
    print(f"\n{len(changed)} of {len(found)} verdicts change.")
    if out is not None:
        out.write_text(json.dumps({"kind": "rule-changes", "rule": stats.ANALYSIS, "changed": len(changed),
                                   "total": len(found), "rows": found}, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
