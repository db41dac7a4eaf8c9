"""``report.md``: the human summary of a run, rendered from a ``RunSummary``.

Sections: headline, settings, the evolution figure, per-generation table, top genes, component
analysis, failures and reproducibility. A run with nothing finished (or only failures) still gets
a complete report that says so in its first lines.
"""

from __future__ import annotations

import os
from pathlib import Path

from .summary import RunSummary
from .tables import code, component_table, fmt, markdown_table, md_cell, write_text

TOP_ROWS = 10
ERROR_CHARS = 300  # failure messages are cut to this length in the table


def _headline(s: RunSummary) -> list[str]:
    lines = [s.statement, ""]
    c = s.counts
    if s.done:
        progress = "The run is finished."
    elif c["planned"]:
        progress = f"The run is not finished: {c['trained']} of {c['planned']} planned evaluations so far."
    else:
        progress = "The run is not finished."
    failed = ", ".join(f"{status} {n}" for status, n in c["failed"].items())
    evaluated = f"- Evaluated: {c['trained']} search evaluations, {c['ok']} finished"
    evaluated += f", {sum(c['failed'].values())} failed ({failed})." if failed else ", none failed."
    lines += [f"- {progress}", evaluated]
    if c.get("cache_hits"):
        lines.append(f"- Cache hits: {c['cache_hits']} requests answered from earlier evaluations.")
    b = s.baseline
    if b is None:
        lines.append("- Baseline: none in this run (started with --no-baseline, or not trained yet).")
    elif b["perplexity"] is None:
        lines.append(f"- Baseline {b['str']} `{b['gene']}` failed "
                     f"({b['status']}): no comparison possible.")
    else:
        text = f"- Baseline {b['str']} `{b['gene']}`: perplexity {fmt(b['perplexity'])}"
        if b["n"] > 1:
            text += f" (mean of {b['n']} evaluations)"
        imp = s.improvement
        if imp is not None:
            better = "lower (better)" if imp["absolute"] >= 0 else "higher (worse)"
            text += (f"; the best gene is {fmt(abs(imp['absolute']))} {better}, "
                     f"**{imp['percent']:+.1f}%** improvement")
        lines.append(text + ".")
    return lines


def _settings(s: RunSummary) -> list[str]:
    if not s.settings:
        return ["No configuration stored."]
    return [markdown_table(["Setting", "Value"], [[md_cell(k), md_cell(v)] for k, v in s.settings]).rstrip()]


def _generations(s: RunSummary) -> list[str]:
    if not s.history:
        return ["No generation finished yet."]
    headers = ["Generation", "Best ppl", "Mean ppl", "Best so far", "Members", "Evaluated", "Failed", "Best gene"]
    rows = [[f"{h['generation']}" + ("" if h["complete"] else " (in progress)"), fmt(h["best_perplexity"]),
             fmt(h["mean_perplexity"]), fmt(h["best_so_far"]), fmt(h["n_members"]), fmt(h["n_evaluated"]),
             fmt(h["n_failed"]), code(h["best_gene"])] for h in s.history]
    note = "Best and mean are over the population after the generation (carried-over elites included)."
    return [note, "", markdown_table(headers, rows, "lrrrrrrl").rstrip()]


def _top(s: RunSummary) -> list[str]:
    top = s.top(TOP_ROWS)
    if not top:
        return [f"{s.statement} No gene to rank."]
    base = s.baseline["perplexity"] if s.baseline else None
    headers = ["Rank", "Gene", "Key", "Perplexity", "vs baseline", "Generation", "Params"]
    rows = [[fmt(r["rank"]), md_cell(r["str"]), code(r["gene"]), fmt(r["perplexity"]),
             f"{100.0 * (base - r['perplexity']) / base:+.1f}%" if base else "-",
             fmt(r["generation"]), fmt(r["params"])] for r in top]
    return [markdown_table(headers, rows, "rllrrrr").rstrip()]


def _failures(s: RunSummary) -> list[str]:
    if not s.failures:
        return ["No evaluation failed."]
    rows = []
    for f in s.failures:
        error = f["error"] or "-"
        if len(error) > ERROR_CHARS:
            error = error[: ERROR_CHARS - 3] + "..."
        rows.append([code(f["gene"]), md_cell(f["role"]), fmt(f["generation"]), md_cell(f["status"]), md_cell(error)])
    return [markdown_table(["Gene", "Role", "Generation", "Status", "Error"], rows, "llrll").rstrip()]


def _reproducibility(s: RunSummary, run_dir: str) -> list[str]:
    lines = [f"- Data fingerprint: `{s.data_fingerprint or 'unknown'}`"]
    lines.append(f"- Started: {s.created_at or 'unknown'}; finished: {s.finished_at or 'not yet'}")
    lines.append(f"- Regenerate this report from the run store: `evo-attention report {run_dir}`")
    if not s.done:
        lines.append(f"- Continue the run: `evo-attention search --out {run_dir} --resume`")
    if s.versions:
        rows = [[md_cell(k), md_cell(v)] for k, v in s.versions.items()]
        lines += ["", markdown_table(["Package", "Version"], rows).rstrip()]
    return lines


def render_report(s: RunSummary, figure: str = "evolution_progress.png", run_dir: str | None = None) -> str:
    """The text of ``report.md``; ``figure`` is the figure's path relative to the report."""
    run_dir = run_dir if run_dir is not None else str(s.run_dir)
    sections = [
        [f"# Evolution report: {md_cell(Path(run_dir).name or run_dir)}", ""] + _headline(s),
        ["## Settings", ""] + _settings(s),
        ["## Evolution", "", f"![Evolution progress: best, mean and every evaluation per generation]({figure})"],
        ["## Per generation", ""] + _generations(s),
        [f"## Top {TOP_ROWS} genes", ""] + _top(s),
        ["## Component analysis", "",
         f"Per gene field and option: finished and failed evaluations, best and mean perplexity, and how many "
         f"of the best {s.top_n} distinct genes use it (also in `component_analysis.csv`).", "",
         component_table(s).rstrip() or f"{s.statement} Nothing to analyse."],
        ["## Failures", ""] + _failures(s),
        ["## Reproducibility", ""] + _reproducibility(s, run_dir),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"


def write_report_md(s: RunSummary, path: str | os.PathLike, figure: str = "evolution_progress.png") -> Path:
    return write_text(path, render_report(s, figure))
