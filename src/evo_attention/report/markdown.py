"""``report.md``: the human summary of a run, rendered from a ``RunSummary``.

A run with nothing finished (or only failures) still gets a complete report that says so in its first lines.
Tables are built from plain-text cells (``studies.common.table_markdown`` escapes them). ``report.html`` is this
text rendered (``html.render_html``), so the two reports always agree; an image's alt text is the figure's
caption there.
"""

from __future__ import annotations

import html
import json
import shlex
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import quote  # a directory the user named may hold a space: the image stays an image

from evo_attention.report.attachments import CURVE_FIGURE, CURVE_RESULTS, CURVE_TABLE, Attachments
from evo_attention.report.summary import (OBJECTIVE_LABELS, RunSummary, caps_text, change_of, infeasible_rows,
                                          infeasible_text)
from evo_attention.report.studies import ablation as _ablation, curves as _curves, suite as _suite
from evo_attention.report.studies import transfer as _transfer, validation as _validation
from evo_attention.report.studies.ablation import contribution_lines, contribution_sign, recipe_mechanism_lines
from evo_attention.report.studies.common import comparison_note, partial_note, table_markdown
from evo_attention.report.studies.curves import curve_note
from evo_attention.report.studies.maps import maps_section
from evo_attention.report.studies.suite import mean_words, suite_cell, suite_points_lines
from evo_attention.report.studies.transfer import transfer_note, transfer_rule_lines
from evo_attention.util.format import change_header, code, direction, finite_or_none, fmt, md_cell, signed_change

TOP_ROWS = 10
ERROR_CHARS = 300  # failure messages are cut to this length in the table


# -- the tables of the run ------------------------------------------------------------------------
def generations_table(s: RunSummary) -> str:
    suite = s.suite is not None
    key, digits = ("suite_accuracy", 4) if suite else ("perplexity", 2)
    headers = ["Generation", *(("Best suite acc", "Mean suite acc") if suite else ("Best ppl", "Mean ppl")),
               "Best so far", "Members",
               *(("Genes trained", "Failed on every point") if suite else ("Evaluated", "Failed")), "Best gene"]
    rows = [[f"{h['generation']}" + ("" if h["complete"] else " (in progress)"), fmt(h[f"best_{key}"], digits),
             fmt(h[f"mean_{key}"], digits), fmt(h["best_so_far"], digits), fmt(h["n_members"]), fmt(h["n_evaluated"]),
             fmt(h["n_failed"]), h["best_gene"]] for h in s.history]
    return table_markdown(headers, rows, "lrrrrrrl", code_column=7)


def top_table(s: RunSummary, k: int = TOP_ROWS) -> str:
    if s.suite is not None:
        return suite_run_table(s, k)
    base = s.baseline["perplexity"] if s.baseline else None
    text = any(r.get("bits_per_byte") is not None for r in s.top(k))  # a text corpus: bits per byte too
    headers = ["Rank", "Gene", "Key", "Perplexity"] + (["Bits/byte"] if text else []) + [
        change_header(), "Generation", "Params"]
    rows = [[fmt(r["rank"]), r["str"], r["gene"], fmt(r["perplexity"])] + ([fmt(r.get("bits_per_byte"), 4)] if text else [])
            + [signed_change((change_of(r["perplexity"], base) or {}).get("percent")), fmt(r["generation"]),
               fmt(r["params"])] for r in s.top(k)]
    return table_markdown(headers, rows, "rllr" + ("r" if text else "") + "rrr", code_column=2)


def suite_run_table(s: RunSummary, k: int = TOP_ROWS) -> str:
    """A suite run's baseline and its best ``k`` ranked genes: suite accuracy, its change from the baseline in
    accuracy points, every point's accuracy."""
    suite = s.suite
    labels = [p["label"] for p in suite["points"]]
    base = (suite.get("baseline") or {}).get("suite_accuracy")
    genes = [r for r in suite["genes"] if r["rank"] is not None][:k]
    rows = []
    for r in ([suite["baseline"]] if suite.get("baseline") else []) + genes:
        is_base = r is suite.get("baseline")
        acc = r["suite_accuracy"]
        change = "-" if is_base or acc is None or base is None else f"{100 * (acc - base):+.1f} pts"
        cells = [r["points"][label] for label in labels]
        rows.append(["baseline" if is_base else fmt(r["rank"]), r["str"], r["gene"], fmt(acc, 4), change]
                    + [suite_cell(c["accuracy"]) if c["status"] == "ok" else c["status"] for c in cells]
                    + [fmt(r["generation"])])
    return table_markdown(["Rank", "Gene", "Key", "Suite accuracy", change_header(lower_is_better=False)] + labels
                          + ["Generation"], rows, "rllrr" + "r" * len(labels) + "r", code_column=2)


def suite_run_lines(s: RunSummary) -> list[str]:
    """The suite section of a suite run: what the score is, and its points."""
    suite = s.suite
    return [f"Each gene trains on every point of suite {md_cell(suite['name'])} ({code(suite.get('source'), False)}) "
            f"with the run's seed; its fitness is its suite accuracy, the {mean_words(suite)} over the points (a "
            "failed point counts 0; higher is better). The top genes table ranks the genes that trained on every point; the "
            "heat map shows every gene's accuracy per point."] + [""] + suite_points_lines(suite)


def _objective_cell(name: str, value) -> str:
    return fmt(int(value) if name in ("params", "flops") and value is not None else value)


def pareto_table(s: RunSummary) -> str:
    """The Pareto front of a multi-objective run: gene, key, each objective, generation."""
    names = s.objectives
    headers = ["Gene", "Key"] + [OBJECTIVE_LABELS.get(n, n).capitalize() for n in names] + ["Generation"]
    rows = [[m["str"], m["key"]] + [_objective_cell(n, m.get(n)) for n in names] + [fmt(m.get("generation"))]
            for m in (s.pareto or {}).get("front", [])]
    return table_markdown(headers, rows, "ll" + "r" * len(names) + "r", code_column=1)


def infeasible_lines(s: RunSummary) -> list[str]:
    """The section on a run's caps: the limits, what they did, the table of infeasible genes."""
    c = s.constraints or {}
    lines = [f"Caps: {caps_text(c)} (a factor such as 1.2x is of the baseline's value). Parameters and FLOPs are "
             f"counted before training, so a gene over their caps is never trained; latency and memory are measured, "
             f"so a gene over their caps is marked after its training. {infeasible_text(c)}. Infeasible genes take no "
             "part in the best gene, the ranking or the Pareto front."]
    if c.get("never_trained") or c.get("trained"):  # refused before training, or trained over a measured cap
        rows = [[r["gene"], fmt(r["generation"]), "yes" if r["trained"] else "no (refused)", r["why"]]
                for r in infeasible_rows(c)]
        lines += ["", table_markdown(["Gene", "Generation", "Trained", "Over the cap"], rows, "lrll", code_column=0)]
    return lines


def racing_lines(s: RunSummary) -> list[str]:
    """The section on a raced run (``search.racing``): the rule, then every raced gene (and the baseline) with its
    value on each seed and the bound it ranks by."""
    r, suite = s.racing or {}, s.suite is not None  # a suite run was told minus the accuracies: shown as accuracies
    seeds = list(r.get("seeds") or [])
    shown = (lambda v: None if v is None else -v) if suite else (lambda v: v)  # noqa: E731
    raced = ([{**r["baseline"], "generation": "baseline"}] if r.get("baseline") else []) + list(r.get("genes") or [])
    rows = [[e["gene"], fmt(e["generation"]), *[fmt(shown(v), 4) for v in e["values"]], fmt(shown(e["told"]), 4)]
            for e in raced]
    what, sign = ("suite accuracy", "minus") if suite else ("perplexity", "plus")
    return [f"Racing: a gene that would take one of the strategy's {fmt(r.get('places'))} elite place(s) was trained "
            f"on {len(seeds)} seeds first (the same seeds for every gene, so comparisons are paired) and ranked by its "
            f"mean {sign} its standard error ({what}); a failure on any seed fails it. Every other gene ranks by its "
            "one seed. The baseline is raced the same way, and the component analysis reads these values.", "",
            table_markdown(["Gene", "Generation", *[f"Seed {x}" for x in seeds],
                            f"Mean {'-' if suite else '+'} standard error"], rows, "lr" + "r" * (len(seeds) + 1),
                           code_column=0)]


def failures_table(s: RunSummary) -> str:
    rows = [[f["gene"], f["role"], fmt(f["generation"]), f["status"],
             error if len(error) <= ERROR_CHARS else error[: ERROR_CHARS - 3] + "..."]
            for f in s.failures for error in [f["error"] or "-"]]
    return table_markdown(["Gene", "Role", "Generation", "Status", "Error"], rows, "llrll", code_column=0)


def components_table(s: RunSummary) -> str:
    """The component analysis (the columns of ``component_analysis.csv``)."""
    headers = ["Field", "Option", "OK runs", "Failed", "Best ppl", "Mean ppl", f"In top {s.top_n}"]
    rows = [[r["field"], r["option"], fmt(r["n_ok"]), fmt(r["n_failed"]), fmt(r["best_perplexity"]),
             fmt(r["mean_perplexity"]), fmt(r["in_top"])] for r in s.components]
    return table_markdown(headers, rows, "llrrrrr", code_column=1)


# -- the tables of the attachments ----------------------------------------------------------------
def _study_table(cells: Callable[[Mapping], tuple | None], code_column: int | None = None) -> Callable:
    """A study's (headers, rows, align) from ``report.studies`` as markdown, gene keys in ``code_column``; None
    where the study has no such table."""
    def table(result: Mapping) -> str | None:
        found = cells(result)
        return None if found is None else table_markdown(*found, code_column=code_column)
    return table


ablation_table = _study_table(_ablation.ablation_table, 2)
recipe_mechanism_table = _study_table(_ablation.recipe_mechanism_table)  # a gene that sets its own recipe, or None
transfer_sizes_table = _study_table(_transfer.transfer_sizes_table)
transfer_table = _study_table(_transfer.transfer_table, 1)
suite_table = _study_table(_suite.suite_table, 1)  # a suite study's table (report.studies.suite_table)


def suite_title(result: Mapping) -> str:
    study = "Compare" if result.get("study") == "compare" else "Multi-seed validation"
    split = "" if result.get("eval_split", "valid") == "valid" else f", {result.get('eval_split')} split"
    return f"{study} on suite {(result.get('suite') or {}).get('name')}{split}"


def compare_table(rows: Sequence[Mapping]) -> str:
    headers = ["Name", "Gene", "Seed", "Status", "Perplexity", "Loss", "Accuracy", "Time (s)", "Peak memory (MB)",
               "Params"]
    out = [[r.get("name"), r.get("gene"), fmt(_integer(r.get("seed"))), r.get("status"),
            fmt(finite_or_none(r.get("val_perplexity")), 3), fmt(finite_or_none(r.get("val_loss")), 4),
            fmt(finite_or_none(r.get("accuracy")), 4), fmt(finite_or_none(r.get("time_s")), 1),
            fmt(finite_or_none(r.get("peak_memory_mb")), 0), fmt(_integer(r.get("params")))] for r in rows]
    return table_markdown(headers, out, "llrlrrrrrr", code_column=1)


def _integer(value: Any) -> int | None:
    number = finite_or_none(value)
    return None if number is None else int(number)


# -- markdown sections ----------------------------------------------------------------------------
def headline_lines(s: RunSummary, attachments: Attachments) -> list[str]:
    """The report's opening lines: the run's statement, its validation, its progress and counts."""
    lines = [s.statement, ""]
    validation = attachments.validation
    validate = code(f"evo-attention validate --from-run {shlex.quote(str(s.run_dir))}", False)
    if validation and validation.get("headline"):
        lines += [f"Validated: {validation['headline']}", ""]
    check = attachments.fresh_check
    if check and check.get("line"):
        lines += [f"Fitness reliability: {check['line']}.", ""]
    c = s.counts
    if s.done:
        progress = "The run is finished."
    elif c["planned"]:
        progress = f"The run is not finished: {c['trained']} of {c['planned']} planned evaluations so far."
    else:
        progress = "The run is not finished."
    failed = ", ".join(f"{status} {n}" for status, n in c["failed"].items())
    unit = "trainings (one per gene and point)" if s.suite is not None else "evaluations"
    evaluated = f"- Evaluated: {c['trained']} search {unit}, {c['ok']} finished"
    evaluated += f", {sum(c['failed'].values())} failed ({failed})" if failed else ", none failed"
    raced = c.get("by_role", {}).get("race")
    evaluated += f"; {raced} more trainings re-measured the elite (racing)." if raced else "."
    lines += [f"- {progress}", evaluated]
    if c.get("cache_hits"):
        lines.append(f"- Cache hits: {c['cache_hits']} requests answered from earlier evaluations.")
    if c.get("equivalent"):
        lines.append(f"- Functional-equivalence cache: {c['equivalent']} evaluations answered by the training of a "
                     "program that computes the same function (same fingerprint), not trained again.")
    b = s.baseline
    if b is None:
        lines.append("- Baseline: none in this run (started with --no-baseline, or not trained yet).")
    elif s.suite is not None:
        if b["suite_accuracy"] is None:
            lines.append(f"- Baseline {b['str']} `{b['gene']}`: {b['status']}, no comparison possible.")
        else:
            change = s.suite.get("vs_baseline")
            lines.append(f"- Baseline {b['str']} `{b['gene']}`: suite accuracy {fmt(b['suite_accuracy'], 4)}"
                         + ("" if change is None else f"; the best gene is **{100 * change:+.1f} accuracy points** "
                                                      "from it") + ".")
        if s.suite.get("vs_baseline") is not None and not validation:
            lines.append(f"- {_selection_seeds(s)}: run {validate} to compare the best genes with the baseline on "
                         "the suite over fresh seeds.")
        return lines
    elif b["perplexity"] is None:
        lines.append(f"- Baseline {b['str']} `{b['gene']}` failed "
                     f"({b['status']}): no comparison possible.")
    else:
        text = f"- Baseline {b['str']} `{b['gene']}`: perplexity {fmt(b['perplexity'])}"
        if s.racing and s.racing.get("baseline"):
            text += f" (mean + standard error over {b['n']} seeds)"
        elif b["n"] > 1:
            text += f" (mean of {b['n']} evaluations)"
        change = s.change
        if change is not None:
            text += (f"; the best gene's change from it **{signed_change(change['percent'])}** "
                     f"({change['absolute']:+.2f}; {direction(True)})")
        lines.append(text + ".")
    if s.change is not None and not validation:
        lines.append(f"- {_selection_seeds(s)}: run {validate} to see whether the difference holds over fresh seeds.")
    return lines


def _selection_seeds(s: RunSummary) -> str:
    """On how many seeds the run ranked its genes (the seeds it selected on)."""
    if not s.racing:
        return "One seed per gene"
    return (f"One seed per gene, {len(s.racing.get('seeds') or [])} for the re-measured elite (ranked by a bound "
            "over them; see Re-measured elites)")


def reproduce_lines(s: RunSummary, run_dir: str, attachments: Attachments) -> list[str]:
    """What identifies the run and the commands that regenerate or repeat its results."""
    run_dir = shlex.quote(str(run_dir))  # a command to paste into a shell
    lines = [f"Data fingerprint: `{s.data_fingerprint or 'unknown'}`",
             f"Started: {s.created_at or 'unknown'}; finished: {s.finished_at or 'not yet'}",
             f"Regenerate this report from the run store: {code(f'evo-attention report {run_dir}', False)}"]
    if not s.done or s.check_pending:
        lines.append(f"Continue the run{' (its fresh-seed check was stopped)' * s.check_pending}: "
                     + code(f"evo-attention search --out {run_dir} --resume", False))
    for v in attachments.validations:
        genes = ",".join(str(r.get("gene")) for r in v.get("genes", []))
        lines.append("Repeat the validation (cached in the run store): " + code(
            f"evo-attention validate --from-run {run_dir} --genes '{genes}' --seeds {len(v.get('seeds') or [])} "
            f"--steps {v.get('steps')}{_split_flag(v)}", False))
    for ab in attachments.ablations:
        lines.append("Repeat the ablation: " + code(
            f"evo-attention ablate --from-run {run_dir} --gene '{ab.get('gene')}' --seeds {len(ab.get('seeds') or [])} "
            f"--steps {ab.get('steps')}{_split_flag(ab)}", False))
    for t in attachments.transfers:
        lines.append("Repeat the transfer study (cached in the run store): "
                     + code(transfer_command(t, run_dir), False))
    return lines


def _split_flag(result: Mapping) -> str:
    return "" if result.get("eval_split", "valid") == "valid" else f" --eval-split {result.get('eval_split')}"


def transfer_command(result: Mapping, run_dir: str) -> str:
    """The command that repeats a transfer study of the run in ``run_dir``."""
    genes = ",".join(str(g.get("gene")) for g in result.get("genes", []))
    sizes = ",".join(str(s.get("size")) for s in result.get("sizes", []))
    budget = (f"--tokens-per-param {result['tokens_per_param']:g}" if result.get("tokens_per_param") else
              "--steps " + ",".join(str(s.get("steps")) for s in result.get("sizes", [])))
    extra = _split_flag(result)
    extra += f" --heads {result['heads']}" if result.get("heads") else ""
    extra += f" --block {result['block']}" if result.get("block", "gpt2") != "gpt2" else ""
    return (f"evo-attention transfer --from-run {run_dir} --genes '{genes}' --sizes {sizes} {budget} "
            f"--seeds {len(result.get('seeds') or [])}{extra}")


def _reproducibility(s: RunSummary, run_dir: str, attachments: Attachments) -> list[str]:
    lines = [f"- {line}" for line in reproduce_lines(s, run_dir, attachments)]
    versions = dict(s.versions)  # the run's, completed by those the analyses recorded
    for result in attachments.validations + attachments.ablations + attachments.transfers:
        for key, value in (result.get("versions") or {}).items():
            versions.setdefault(key, value)
    if versions:
        lines += ["", "Package versions:", "", table_markdown(["Package", "Version"], list(versions.items()), "ll")]
    if s.config:
        lines += ["", "Full configuration of the run:", "", "```json",
                  json.dumps(s.config, indent=2, sort_keys=True, ensure_ascii=False, default=str), "```"]
    if isinstance(s.data, Mapping) and s.data:
        lines += ["", "The data:", "", "```json", json.dumps(s.data, indent=2, sort_keys=True, default=str), "```"]
    return lines


def _attachment_sections(a: Attachments) -> list[list[str]]:
    """The markdown sections of the analyses (none when the run directory holds none)."""
    sections = []
    for v in a.validations:
        split = "test split" if v.get("eval_split") == "test" else "validation split"
        stem = v["_file"].rsplit(".", 1)[0]
        costs, seeds = _validation.cost_markdown(v), v.get("seeds") or []  # costs: None without them
        note = (f"{len(seeds)} trainings per gene with seeds {', '.join(map(str, seeds))} (never the search seed), "
                f"{v.get('steps')} steps each. {comparison_note(v)}")
        sections.append([f"## Multi-seed validation ({split})", "", v.get("headline", ""), "", md_cell(note), "",
                         _validation.validation_table_markdown(v).rstrip(), ""]
                        + (["Cost, the median over the seeds:", "", costs.rstrip(), ""] if costs else [])
                        + [f"![Every seed's value (points), box, mean (diamond) and its confidence interval (bar); the "
                           f"dotted line is the baseline mean]({stem}.png)", "",
                           f"Details: {code(v['_file'], False)}, {code(stem + '.md', False)}."])
    for ab in a.ablations:
        stem = ab["_file"].rsplit(".", 1)[0]
        crossed = recipe_mechanism_table(ab)
        recipe = (["", "Recipe or mechanism (the gene sets its own recipe; every crossing on the same seeds):", "",
                   crossed, ""] + [f"- {md_cell(t)}" for t in recipe_mechanism_lines(ab)]) if crossed else []
        sections.append([f"## Ablation of {md_cell(ab.get('str'))}", "",
                         "Each field in which the gene differs from the baseline, set back to the baseline's value "
                         f"(without F) and added alone to the baseline (baseline + F). {contribution_sign(ab)}", "",
                         ablation_table(ab), ""] + [f"- {md_cell(t)}" for t in contribution_lines(ab)]
                        + recipe + ["", f"![Contributions]({stem}.png)"])
    for t in a.transfers:
        stem = t["_file"].rsplit(".", 1)[0]
        sections.append(["## Transfer across scale", "", t.get("headline", ""), "", md_cell(transfer_note(t)), "",
                         transfer_sizes_table(t), "", transfer_table(t), ""]
                        + [f"- {line}" for line in transfer_rule_lines()]
                        + ["", f"![Each gene's mean against its parameters at every size (log axes), with the interval "
                              f"of the mean; the baseline is black]({stem}.png)", "",
                              f"Details: {code(t['_file'], False)}, {code(stem + '.md', False)}."])
    for r in a.suites:
        stem = r["_file"].rsplit(".", 1)[0]
        sections.append([f"## {suite_title(r)}", "", r.get("headline", ""), "", suite_table(r), "",
                         *([partial, ""] if (partial := partial_note(r)) else []),
                         f"![Mean accuracy over the seeds per gene and point (± sd), the suite accuracy last]({stem}.png)",
                         "", f"Details: {code(r['_file'], False)}, {code(stem + '.md', False)}."])
    if a.compare is not None:
        body = compare_table(a.compare) if a.compare else "The compare results list no entry."
        sections.append(["## Compare", "", "From `compare_results.json`.", "", body])
    for c in a.curves:
        prefix = "" if c["_dir"] == "." else c["_dir"].rstrip("/") + "/"
        sections.append([f"## Difficulty curve: accuracy against {md_cell(c.get('knob'))} ({md_cell(c.get('task'))})",
                         "", md_cell(curve_note(c)), "", _curves.curve_table_markdown(c).rstrip(), "",
                         f"![Each gene's mean accuracy against {md_cell(c.get('knob'))}, its interval as a band; chance "
                         f"dashed, the break threshold dotted]({quote(prefix + CURVE_FIGURE)})", "",
                         f"Details: {code(prefix + CURVE_RESULTS, False)}, {code(prefix + CURVE_TABLE, False)}."])
    sections += [maps_section(m) for m in a.maps]
    if a.problems:
        sections.append(["## Unreadable analysis files", ""] + [f"- {md_cell(p)}" for p in a.problems])
    return sections


def _pareto(s: RunSummary, figure: str) -> list[str]:
    """The Pareto section of a multi-objective run: the figure, what was minimised, the front, the reference
    point, the hypervolume after each generation."""
    p = s.pareto
    lines = [f"![Every evaluation on the first two objectives, the Pareto front as a step line, the baseline as a "
             f"star]({figure})", "",
             f"Objectives, all minimised: {', '.join(s.objectives)} (the first is primary: the best gene above is the "
             f"lowest perplexity). The front holds {p.get('front_size', 0)} non-dominated finished evaluation(s)."]
    if p.get("reference_point"):
        point = ", ".join(f"{n} {_objective_cell(n, v)}" for n, v in p["reference_point"].items())
        ideal = ", ".join(f"{n} {_objective_cell(n, v)}" for n, v in (p.get("ideal_point") or {}).items())
        lines += ["", f"Hypervolume {fmt(p.get('hypervolume'), 4)} with reference point ({point}) and ideal point "
                      f"({ideal}): {p.get('reference_rule')}."]
    if p["front"]:
        lines += ["", pareto_table(s)]
    if p["history"]:
        rows = [[fmt(h["generation"]), fmt(h["front_size"]), fmt(h["hypervolume"], 4)] for h in p["history"]]
        lines += ["", "Hypervolume after each generation (the evaluations of that generation and the ones before):",
                  "", table_markdown(["Generation", "Front size", "Hypervolume"], rows, "rrr")]
    return lines


def render_report(s: RunSummary, attachments: Attachments, figures: Mapping[str, str] | None = None) -> str:
    """The text of ``report.md``, with a section per analysis in ``attachments``. ``figures`` maps a figure's kind
    (``evolution``, ``distribution``, ``curves``, ``pareto``, ``suite``, ``program``) to its path relative to the
    report; a figure not named is omitted (the evolution figure defaults to its usual name)."""
    figures = {"evolution": "evolution_progress.png", **(figures or {})}
    figure, distribution, curves, pareto, suite_figure, program_figure = (
        figures.get(k) for k in ("evolution", "distribution", "curves", "pareto", "suite", "program"))
    run_dir = str(s.run_dir)
    sections = [
        [f"# Evolution report: {html.escape(md_cell(Path(run_dir).name or run_dir))}", ""] + headline_lines(s, attachments),
        ["## Settings", "", table_markdown(["Setting", "Value"], s.settings, "ll") if s.settings
         else "No configuration stored."],
        ["## Evolution", "", f"![Best and mean {'suite accuracy' if s.suite is not None else 'perplexity'} per "
                             f"generation, the best so far, every evaluation (grey) and the baseline]({figure})"],
    ]
    if s.suite is not None:
        sections.append(["## Suite", ""] + suite_run_lines(s)
                        + ([] if suite_figure is None else ["", f"![Every gene's accuracy on every point (one seed) and its suite "
                                                               f"accuracy]({suite_figure})"]))
    if program_figure and s.best and s.best.get("program"):
        sections.append(["## The best gene's program", "", code(s.best['program'], False), "",
                         f"![Each distinct node once, the inputs at the bottom, an arrow from each argument to the op "
                         f"that reads it]({program_figure})"])
    if pareto and s.multi_objective:
        sections.append(["## Pareto front", ""] + _pareto(s, pareto))
    if distribution:
        what = "search gene's suite accuracy" if s.suite is not None else "search evaluation's perplexity"
        sections.append(["## Distribution of all evaluations", "", f"![Every finished {what}, not just the best: "
                                                                  f"where the baseline and the winner lie]({distribution})"])
    if curves and s.suite is None:  # a suite run has a curve per gene and point, none per gene
        rungs = "; dotted lines mark the rungs of the multi-fidelity schedule" if (s.fidelity or {}).get("rungs") else ""
        sections.append(["## Learning curves", "", f"![Training loss (solid) and validation loss (dashed) of the best "
                                                   f"genes and the baseline{rungs}]({curves})"])
    sections += [
        ["## Per generation", ""] + (["Best and mean are over the population after the generation (carried-over "
                                      "elites included).", "", generations_table(s)] if s.history
                                     else ["No generation finished yet."]),
        [f"## Top {TOP_ROWS} genes", "", top_table(s) if s.top(TOP_ROWS)
         else f"{s.statement} No gene to rank."],
        ["## Component analysis", "", components_note(s)] + ([] if s.suite is not None else [
            "", components_table(s) if s.components else f"{s.statement} Nothing to analyse."]),
    ]
    sections += _attachment_sections(attachments)
    if s.constraints:
        sections.append(["## Infeasible genes", ""] + infeasible_lines(s))
    if s.racing:
        sections.append(["## Re-measured elites", ""] + racing_lines(s))
    sections += [
        ["## Failures", "", failures_table(s) if s.failures else "No evaluation failed."],
        ["## Reproducibility", ""] + _reproducibility(s, run_dir, attachments),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"


def components_note(s: RunSummary) -> str:
    if s.suite is not None:
        return ("Not computed for a suite run: the analysis ranks options by perplexity, and a suite has no single "
                "perplexity (the suite table and `evaluations.csv` give every training).")
    return (f"Per gene field and option: finished and failed evaluations, best and mean perplexity, and how many "
            f"of the best {s.top_n} distinct genes use it (also in `component_analysis.csv`).")
