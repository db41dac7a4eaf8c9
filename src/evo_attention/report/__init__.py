"""The reporting layer: every output of a run, derived from its run store alone.

``write_report(run_dir)`` (re)writes into ``run_dir``:

- ``final_results.json``: best gene, history, top 5, baseline, change (vs the baseline), config, counts, ...
- ``evaluations.csv``: one row per stored evaluation (all roles)
- ``evolution_progress.png``: perplexity per generation (best, mean, best so far, all points)
- ``component_analysis.csv`` / ``component_analysis.md``: per gene field and option
- ``evaluation_distribution.png``: the histogram of every finished search evaluation
- ``learning_curves.png``: the training-loss curves of the best genes and the baseline
- ``report.md``: the human summary linking the figures, and ``report.html``, the same as one self-contained page
- ``pareto.png`` (multi-objective runs only; both reports then get a Pareto section), ``suite.png`` (suite
  runs only: every gene's accuracy per point; both reports then get a Suite section and rank by suite
  accuracy), ``best_program.png`` (when the best gene has a program)

Both reports also show what the analysis commands left in ``run_dir`` (``Attachments``). ``load_run(run_dir)``
gives the ``RunSummary`` these are made from. Both open the store read-only, so they may run while a search is
still writing to it (``evo-attention report DIR``).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from evo_attention.util.errors import UserError
from evo_attention.report.attachments import Attachments, load_attachments
from evo_attention.report.studies.validation import read_studies
from evo_attention.report.summary import (EVALUATION_COLUMNS, FINAL_RESULTS_KEYS, RunSummary, failed, load_run,
                                          perplexity_of)
from evo_attention.search.store import RunStore, StoreLost

OUTPUTS = {
    "final_results": "final_results.json",
    "evaluations": "evaluations.csv",
    "evolution_progress": "evolution_progress.png",
    "component_analysis_csv": "component_analysis.csv",
    "component_analysis_md": "component_analysis.md",
    "evaluation_distribution": "evaluation_distribution.png",
    "learning_curves": "learning_curves.png",
    "report": "report.md",
    "report_html": "report.html",
}
# written only for a multi-objective run (a single-objective run's outputs are exactly OUTPUTS)
PARETO_OUTPUT = ("pareto", "pareto.png")
SUITE_OUTPUT = ("suite", "suite.png")  # written only for a suite run
PROGRAM_OUTPUT = ("program", "best_program.png")  # written only when the best gene has a program


def final_results_text(summary: RunSummary) -> str:
    """The text of ``final_results.json``: strict JSON (NaN/inf written as null), stable order."""
    return json.dumps(summary.final_results(), indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def write_report(run_dir: str | os.PathLike) -> dict[str, Path]:
    """Write every report output of the run in ``run_dir`` into it; returns name -> path.

    Raises ``UserError`` if ``run_dir`` holds no run, ``StoreLost`` if the run leaves it (moved, deleted, or
    replaced by another run) while its report is written. Each file is replaced atomically.
    """
    run_dir = Path(run_dir)
    loaded = _stat(run_dir)  # the run.db this report describes: another one at run_dir later is another run
    summary = load_run(run_dir)
    attachments = read_studies(run_dir)
    paths = {name: run_dir / filename for name, filename in OUTPUTS.items()}
    extra = ((PARETO_OUTPUT, summary.multi_objective), (SUITE_OUTPUT, summary.suite is not None),
             (PROGRAM_OUTPUT, best_program(summary)))  # each written only for the runs that have it
    paths.update({name: run_dir / filename for (name, filename), written in extra if written})
    try:
        _write_all(summary, attachments, paths, lambda wrote: _still_there(run_dir, loaded, wrote))
        _still_there(run_dir, loaded, wrote=True)
    except OSError as exc:  # a full disk, a read-only directory, a file-size limit: the store is untouched
        _still_there(run_dir, loaded, wrote=False)  # its files could not be written where the run left
        fix = ("raise the file-size limit (ulimit -f)" if exc.errno == errno.EFBIG
               else "free space or make the directory writable")
        raise UserError(f"cannot write the report into {run_dir} ({exc.strerror or exc}): {fix}, then write the "
                        "report again; the run store is unchanged") from None
    return paths


def _stat(run_dir: Path) -> os.stat_result | None:
    try:
        return os.stat(RunStore.db_path(run_dir))
    except OSError:
        return None


def _still_there(run_dir: Path, loaded: os.stat_result | None, wrote: bool) -> None:
    """StoreLost unless ``run_dir``'s run.db is still the file ``loaded`` (st_dev, st_ino): the report's files were
    (``wrote``) or are about to be written into another run's directory, or into none."""
    now = _stat(run_dir)
    if now is not None and loaded is not None and os.path.samestat(now, loaded):
        return
    if now is None:
        raise StoreLost(f"{run_dir} was moved or deleted while its report was written: the run is no longer there; "
                        "if it was moved, write its report from its new directory") from None
    raise StoreLost(f"{run_dir} was moved or replaced while its report was written: the run is no longer there, and "
                    f"{run_dir} now holds another run" + (", whose report files this run's overwrote: write that run's "
                                                          "report again" if wrote else " (none of its files touched)")
                    + "; if this run was moved, write its report from its new directory") from None


def _write_all(summary: RunSummary, attachments, paths: dict[str, Path], still_there) -> None:
    """Every report file; ``still_there(wrote)`` before the first and before the text reports (after the slow
    figures), so that a run replaced at its path is noticed before its files are written there."""
    from evo_attention.report import figures, html, markdown, tables  # matplotlib is imported only when writing
    from evo_attention.util.files import write_text

    still_there(False)
    write_text(paths["final_results"], final_results_text(summary))
    tables.write_csv(paths["evaluations"], EVALUATION_COLUMNS, summary.evaluation_rows())  # every role
    figures.plot_evolution(summary, paths["evolution_progress"])
    plot_distribution(summary, paths["evaluation_distribution"])
    figures.plot_learning_curves(summary, paths["learning_curves"])
    if "pareto" in paths:
        figures.plot_pareto(summary, paths["pareto"])
    if "suite" in paths:
        plot_suite(summary, paths["suite"])
    if "program" in paths:
        figures.plot_program(best_program(summary), paths["program"])
    tables.write_component_csv(summary, paths["component_analysis_csv"])
    write_text(paths["component_analysis_md"], tables.component_markdown(summary))
    figure_paths = {"evolution": paths["evolution_progress"], "distribution": paths["evaluation_distribution"],
                    "curves": paths["learning_curves"],
                    **{k: paths[k] for k in ("pareto", "suite", "program") if k in paths}}
    text = markdown.render_report(summary, attachments, {k: p.name for k, p in figure_paths.items()})
    still_there(True)
    write_text(paths["report"], text)
    write_text(paths["report_html"], html.render_html(text, paths["report"].parent))


def best_program(summary: RunSummary) -> str | None:
    """The program of the run's best gene (its first layer's), or None."""
    return (summary.best or {}).get("program")


def plot_distribution(summary: RunSummary, path: str | os.PathLike) -> Path:
    """``evaluation_distribution.png``: every finished search evaluation's perplexity."""
    from evo_attention.report.figures import plot_distribution as draw

    if summary.suite is not None:  # one value per gene: its suite accuracy
        rows = [r for r in summary.suite["genes"] if r["rank"] is not None]
        base = summary.baseline["suite_accuracy"] if summary.baseline else None
        best = summary.best["suite_accuracy"] if summary.best else None
        return draw([r["suite_accuracy"] for r in rows], path, failed=len(summary.suite["genes"]) - len(rows),
                    baseline=base, best=best, xlabel="Suite accuracy (higher is better)",
                    title="Suite accuracy of every search gene")
    search = summary.search_evaluations
    values = [perplexity_of(r) for r in search if not failed(r)]
    baseline = summary.baseline["perplexity"] if summary.baseline else None
    return draw(values, path, failed=len(search) - len(values), baseline=baseline,
                best=summary.best_perplexity, title="All search evaluations")


def plot_suite(summary: RunSummary, path: str | os.PathLike) -> Path:
    """``suite.png``: the baseline and every search gene (ranked ones best first) on every point."""
    from evo_attention.report.figures import plot_suite_heatmap

    suite = summary.suite
    labels = [p["label"] for p in suite["points"]]
    rows = []
    for r in ([suite["baseline"]] if suite.get("baseline") else []) + suite["genes"]:
        name = ("baseline " if r is suite.get("baseline") else f"#{r['rank']} " if r["rank"] else "") + r["str"]
        cells = [r["points"][label] for label in labels]
        rows.append({"name": name, "sds": [None] * (len(labels) + 1),
                     "means": [c["accuracy"] if c["status"] == "ok" else None if c["status"] == "missing" else 0.0
                               for c in cells] + [r["suite_accuracy"]],
                     "failed": [int(c["status"] not in ("ok", "missing")) for c in cells] + [0]})
    return plot_suite_heatmap(labels + ["suite"], rows, path,
                              title=f"Suite {suite['name']}: accuracy per point (seed {summary.config.get('seed')})")


__all__ = ["FINAL_RESULTS_KEYS", "OUTPUTS", "PARETO_OUTPUT", "SUITE_OUTPUT", "Attachments", "RunSummary",
           "final_results_text", "load_attachments", "load_run", "write_report"]
