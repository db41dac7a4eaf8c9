"""Several runs side by side: the strategies (or settings) of one study, each from its own store.

``write_comparison(run_dirs, out_dir)`` writes ``runs.json`` (per run its search result, anytime curve, front
and its own validation where one was left; and ``differences``, every setting in which the runs differ besides
the strategy), ``runs.md`` (the same as a table) and ``runs.png``.

The hypervolumes are measured in one box common to all runs (``search.pareto.bounds`` over every run's
finished search evaluations), so they compare across runs (each run's own report uses its own box). The
search-seed perplexities are biased low (the best of many single trainings); validated means on fresh seeds are
the unbiased comparison.
"""

from __future__ import annotations

import math
import os
import shlex
from pathlib import Path
from typing import Sequence

from evo_attention.report.studies.common import change_text, verdict_cell
from evo_attention.report.studies.validation import read_studies
from evo_attention.report.summary import OBJECTIVE_LABELS, RunSummary, failed, load_run, perplexity_of
from evo_attention.search import pareto
from evo_attention.util.errors import UserError
from evo_attention.util.format import change_header, code, markdown_table, number, signed_change

OUTPUTS = {"json": "runs.json", "md": "runs.md", "png": "runs.png"}
OUTPUT_KIND = "a comparison of runs"  # what --out holds, in the output rule's messages
# config keys that name the strategy itself: runs that differ only in these compare strategies
STRATEGY_KEYS = ("strategy", "strategy_options")


def compare_runs(run_dirs: Sequence[str | os.PathLike]) -> dict:
    """The content of ``runs.json`` for the runs in ``run_dirs`` (at least two, each a run store)."""
    if len(run_dirs) < 2:
        raise UserError(f"comparing runs needs at least two run directories, got {len(run_dirs)}", setting="run_dirs")
    summaries = [load_run(d) for d in run_dirs]
    _check_one_kind(run_dirs, summaries)
    names = [s.run_dir.name for s in summaries]
    if len(set(names)) < len(names):  # two runs share a directory name: each with its parent's
        names = [f"{s.run_dir.parent.name}/{s.run_dir.name}" for s in summaries]
    objectives = summaries[0].objectives
    shared = all(s.objectives == objectives for s in summaries) and len(objectives) > 1
    box = pareto.bounds([p for s in summaries for p in s.search_points(objectives)]) if shared else None
    runs = [_run_row(name, s, objectives if shared else None, box) for name, s in zip(names, summaries)]
    return {
        "kind": "runs",
        "runs": runs,
        "objectives": objectives if shared else None,
        "box": {"ideal_point": dict(zip(objectives, box[0])), "reference_point": dict(zip(objectives, box[1]))}
        if box else None,
        "differences": _differences(summaries),
    }


def input_runs(run_dirs: Sequence[str | os.PathLike]) -> dict:
    """The runs a comparison reads, named for ``util.files.check_output``'s ``sources``."""
    return {f"input run {i + 1} of {len(run_dirs)}": run_dir for i, run_dir in enumerate(run_dirs)}


def write_comparison(run_dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``runs.json``, ``runs.md`` and ``runs.png`` for ``run_dirs`` into ``out_dir``, which follows the one
    output rule (``util.files.check_output``: never one of the runs, a run store, a locked or a model directory,
    or a file), checked before anything is read or written."""
    from evo_attention.util.files import check_output, output_dir, write_text
    from evo_attention.util.jsonio import write_json

    check_output(out_dir, "out", kind=OUTPUT_KIND, sources=input_runs(run_dirs))
    result = compare_runs(run_dirs)
    out = output_dir(out_dir)
    paths = {key: out / name for key, name in OUTPUTS.items()}
    from evo_attention.report.figures import plot_runs  # matplotlib is imported only when writing

    try:
        write_json(paths["json"], result)
        write_text(paths["md"], comparison_markdown(result, figure=OUTPUTS["png"]))
        plot_runs(result, paths["png"])
    except OSError as exc:
        raise UserError(f"cannot write the comparison into {out} ({exc.strerror or exc}): free space or make the "
                        "directory writable; the run stores are unchanged", setting="out") from None
    return paths


def _check_one_kind(run_dirs: Sequence, summaries: list[RunSummary]) -> None:
    """UserError unless every store is a search's and all rank by the same measure (suite accuracy, or not)."""
    from evo_attention.search.store import RunStore

    for run_dir in run_dirs:
        with RunStore.open(run_dir, readonly=True) as store:
            kind = store.kind()
        if kind != "search":
            raise UserError(f"{run_dir} holds the store of a {kind}, not of a search: report A B compares searches; "
                            f"report it alone (evo-attention report {shlex.quote(str(run_dir))})", setting="run_dirs")
    suites = {d: s.suite is not None for d, s in zip(run_dirs, summaries)}
    if len(set(suites.values())) > 1:
        suite = next(d for d, is_suite in suites.items() if is_suite)
        other = next(d for d, is_suite in suites.items() if not is_suite)
        raise UserError(f"{suite} is a suite run (ranked by suite accuracy) and {other} is not: compare suite runs "
                        "with suite runs, other searches with other searches", setting="run_dirs")


# -- one run ----------------------------------------------------------------------------------------
def _anytime(summary: RunSummary) -> list[float | None]:
    """The best search perplexity within the run's caps after each search training, in store order (a gene
    over a cap counts as a training, never as the best)."""
    best, curve = math.inf, []
    infeasible = summary.infeasible_keys
    for record in summary.search_evaluations:
        if str(record.get("gene")) not in infeasible:
            best = min(best, perplexity_of(record))
        curve.append(best if math.isfinite(best) else None)
    return curve


def _validated(summary: RunSummary) -> dict | None:
    """The run's validation of its best gene (else of its first validated gene), with the baseline's."""
    validation = read_studies(summary.run_dir).validation
    if not validation or not validation.get("genes"):
        return None
    genes = validation["genes"]
    entry = next((g for g in genes if g.get("gene") == summary.best_gene), genes[0])
    base = validation.get("baseline") or {}
    return {"gene": entry.get("gene"), "metric": validation.get("metric"), "n": entry.get("n"),
            "mean": entry.get("mean"), "ci_low": entry.get("ci_low"), "ci_high": entry.get("ci_high"),
            "baseline_mean": base.get("mean"), "difference": entry.get("difference"),
            "diff_ci_low": entry.get("diff_ci_low"), "diff_ci_high": entry.get("diff_ci_high"),
            "change": change_text(entry, validation.get("metric", "")), "p_holm": entry.get("p_holm"),
            "family_size": validation.get("family_size"), "verdict": entry.get("verdict"),
            "verdict_label": verdict_cell(entry), "recomputed": bool(validation.get("recomputed")),
            "seeds": entry.get("seeds")}


def _run_row(name: str, summary: RunSummary, objectives: Sequence[str] | None, box) -> dict:
    search = summary.search_evaluations
    row = {
        "name": name, "run_dir": str(summary.run_dir),
        "strategy": (summary.strategy or {}).get("name") or summary.config.get("strategy"),
        "objectives": summary.objectives, "done": summary.done,
        "search_trainings": summary.counts["trained"], "failed": sum(1 for r in search if failed(r)),
        "unique_genes": len(summary.ranking),
        "best_gene": summary.best_gene, "best_perplexity": summary.best_perplexity,
        "best_generation": summary.best_generation,
        "baseline_perplexity": summary.baseline["perplexity"] if summary.baseline else None,
        "change_percent": (summary.change or {}).get("percent"),
        "anytime": _anytime(summary),
        "validated": _validated(summary),
    }
    if objectives is not None:
        points = summary.search_points(objectives)
        members = sorted({points[i] for i in pareto.front(points)})
        row["front"] = [dict(zip(objectives, p)) for p in members]
        row["front_size"] = len(members)
        row["hypervolume"] = pareto.hypervolume_share(points, *box) if box and points else None
    return row


def _differences(summaries: list[RunSummary]) -> dict:
    """Setting -> each run's value, for every config setting (and the data) the runs do not share."""
    keys = sorted({k for s in summaries for k in s.config} - set(STRATEGY_KEYS))
    out = {k: [s.config.get(k) for s in summaries] for k in keys
           if any(s.config.get(k) != summaries[0].config.get(k) for s in summaries)}
    prints = [s.data_fingerprint for s in summaries]
    if len(set(prints)) > 1:
        out["data_fingerprint"] = prints
    return out


# -- writing ----------------------------------------------------------------------------------------
def comparison_markdown(result: dict, figure: str | None = None) -> str:
    runs = result["runs"]
    objectives = result.get("objectives")
    headers = ["Run", "Strategy", "Search trainings", "Best gene (search seed)", "Perplexity", "Baseline",
               change_header("Change vs baseline")]
    if objectives:
        headers += ["Front size", "Hypervolume (common box)"]
    headers += ["Validated mean [CI]", change_header("Paired change vs baseline [CI]"), "Verdict"]
    rows = []
    for run in runs:
        row = [run["name"], run["strategy"] or "-",
               f"{run['search_trainings']}" + (f" ({run['failed']} failed)" if run["failed"] else ""),
               code(run["best_gene"]), number(run["best_perplexity"], ".2f"), number(run["baseline_perplexity"], ".2f"),
               signed_change(run["change_percent"])]
        if objectives:
            row += [run.get("front_size", "-"), number(run.get("hypervolume"), ".3f")]
        v = run["validated"]
        if v:
            gene = "" if v["gene"] == run["best_gene"] else f" ({code(v['gene'])})"
            row += [f"{number(v['mean'], '.2f')} [{number(v['ci_low'], '.2f')}, {number(v['ci_high'], '.2f')}]{gene}",
                    v["change"], (v["verdict_label"] or "-") + (" (recomputed)" if v["recomputed"] else "")]
        else:
            row += ["not validated", "-", "-"]
        rows.append(row)
    align = "llrlrrr" + ("rr" if objectives else "") + "rrl"
    lines = ["# Runs compared", "",
             markdown_table(headers, rows, align).rstrip("\n"),
             "",
             "Perplexity and its change are on the search seed (the best of many single trainings, so biased "
             "low). The validated columns come from each run's `evo-attention validate --from-run`: its best gene "
             "retrained on fresh seeds against the baseline on the same seeds."]
    if objectives:
        box = result["box"]
        bounds = ", ".join(f"{OBJECTIVE_LABELS.get(k, k)} {number(box['ideal_point'][k], '.4g')} to "
                           f"{number(box['reference_point'][k], '.4g')}" for k in objectives)
        lines += ["", f"Hypervolume: the share of one box common to all runs ({bounds}) that each run's finished "
                      "search evaluations dominate (0 to 1), so the values compare across runs."]
    differences = result["differences"]
    if differences:
        said = "; ".join(f"{k}: {', '.join(str(v) for v in values)}" for k, values in differences.items())
        lines += ["", f"**The runs differ in more than the strategy**, so read the comparison with care: {said}."]
    else:
        lines += ["", "The runs share every setting but the strategy: the same data, model, budget and seed."]
    if figure:
        lines += ["", f"![Best perplexity against search trainings spent]({figure})"]
    return "\n".join(lines) + "\n"
