"""``report.html``: the run's report as one self-contained page.

Every figure is embedded as a base64 ``data:`` URI and the style sheet is inline, so the file
opens in any browser straight from the disk, with no server, no network and no JavaScript. The
page has the sections of ``report.md`` (and its tables, built by the same ``markdown.*_table``
functions), plus the full configuration. Thin: nothing is computed here; every text goes through
``html.escape``.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
from pathlib import Path
from typing import Mapping, Sequence

from evo_attention.report import markdown as md
from evo_attention.report.attachments import CURVE_FIGURE, Attachments
from evo_attention.report.studies.ablation import contribution_lines, contribution_sign, recipe_mechanism_lines
from evo_attention.report.studies.common import comparison_note
from evo_attention.report.studies.transfer import transfer_note, transfer_rule_lines
from evo_attention.report.summary import RunSummary

STYLE = """
:root { color-scheme: light; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: #1d2329; background: #f6f7f9; margin: 0; }
main { max-width: 1280px; margin: 0 auto; padding: 24px 28px 60px; background: #fff; }
h1 { font-size: 1.7em; margin: 0.2em 0 0.4em; }
h2 { font-size: 1.3em; margin-top: 2em; padding-bottom: 0.2em; border-bottom: 1px solid #dde1e6; }
h3 { font-size: 1.05em; margin-top: 1.4em; }
nav.toc { font-size: 0.9em; margin: 0.6em 0 1.2em; display: flex; flex-wrap: wrap; gap: 0.2em 1em; }
nav.toc a { color: #2458a6; text-decoration: none; white-space: nowrap; }
.headline { background: #eef4fb; border-left: 4px solid #2458a6; padding: 10px 16px; margin: 1em 0; }
.validated { background: #eef8f0; border-left-color: #2f8a46; }
.scroll { overflow-x: auto; margin: 0.8em 0; }
table { border-collapse: collapse; font-size: 0.82em; }
th, td { border: 1px solid #dde1e6; padding: 3px 7px; vertical-align: top; }
th { background: #f0f2f5; text-align: left; }
td.r { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafbfc; }
code { font: 0.9em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #f0f2f5;
       padding: 0 3px; border-radius: 3px; white-space: nowrap; }
li code { white-space: normal; word-break: break-all; }
pre { font: 0.85em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #f6f8fa;
      padding: 10px; overflow-x: auto; }
figure { margin: 1em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eceff3; }
figcaption { font-size: 0.85em; color: #5a6470; }
.good { color: #1f7a3a; font-weight: 600; }
.bad { color: #b3261e; font-weight: 600; }
.muted { color: #5a6470; }
ul.contrib li { margin: 0.2em 0; }
details summary { cursor: pointer; color: #2458a6; }
"""

_BOLD = re.compile(r"\*\*(.+?)\*\*")
_CODE = re.compile(r"`([^`]+)`")


def esc(value) -> str:
    return html.escape("-" if value is None else str(value), quote=True)


def inline(text: str) -> str:
    """Escape ``text``, then render its markdown **bold** and `code` spans."""
    out = _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", esc(text))
    return _BOLD.sub(lambda m: f"<strong>{m.group(1)}</strong>", out)


def _verdict_class(text: str) -> str:
    return next((cls for word, cls in (("better", "good"), ("worse", "bad")) if text.startswith(word)), "")


def _cell(t: md.Table, i: int, cell) -> str:
    align = t.align[i] if i < len(t.align) else "l"
    classes = [c for c in ("r" if align == "r" else "", _verdict_class(str(cell or ""))) if c]
    attr = f' class="{" ".join(classes)}"' if classes else ""
    text = f"<code>{esc(cell)}</code>" if i in t.code and cell is not None else esc(cell)
    return f"<td{attr}>{text}</td>"


def table(t: md.Table) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in t.headers)
    body = "".join("<tr>" + "".join(_cell(t, i, cell) for i, cell in enumerate(row)) + "</tr>" for row in t.rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def image(path: str | os.PathLike, alt: str, caption: str | None = None) -> str:
    """The PNG at ``path`` embedded as a data URI (a note instead when it is missing)."""
    path = Path(path)
    try:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
    except OSError:
        return f'<p class="muted">Figure {esc(path.name)} is missing.</p>'
    cap = f"<figcaption>{inline(caption)}</figcaption>" if caption else ""
    return f'<figure><img alt="{esc(alt)}" src="data:image/png;base64,{data}">{cap}</figure>'


def _class(cls: str | None) -> str:
    return f' class="{esc(cls)}"' if cls else ""


def para(text: str, cls: str | None = None) -> str:
    return f"<p{_class(cls)}>{inline(text)}</p>"


def bullets(lines: Sequence[str], cls: str | None = None) -> str:
    items = "".join(f"<li>{inline(line)}</li>" for line in lines)
    return f"<ul{_class(cls)}>{items}</ul>"


def _section(anchor: str, title: str, body: Sequence[str]) -> tuple[str, str, str]:
    return anchor, title, f'<section id="{anchor}"><h2>{esc(title)}</h2>{"".join(body)}</section>'


def _figure_in(run_dir: Path, subdir: str, name) -> Path | None:
    """A figure named in an attachment: a plain ``*.png`` file name inside the run directory."""
    if not isinstance(name, str) or Path(name).name != name or not name.endswith(".png"):
        return None
    return run_dir / subdir / name  # pathlib drops a "." or "" subdir


# -- the sections ---------------------------------------------------------------------------------
def _summary_section(s: RunSummary, a: Attachments) -> tuple[str, str, str]:
    lines = md.headline_lines(s, a)
    statement, rest = lines[0], [line for line in lines[1:] if line]
    body = [f'<div class="headline">{inline(statement)}</div>']
    validated = [line for line in rest if line.startswith("Validated: ")]
    body += [f'<div class="headline validated">{inline(line)}</div>' for line in validated]
    body.append(bullets([line[2:] if line.startswith("- ") else line for line in rest if line not in validated]))
    return _section("summary", "Summary", body)


def _run_sections(s: RunSummary, figures: Mapping[str, Path]) -> list[tuple[str, str, str]]:
    out = [_section("settings", "Settings", [table(md.settings_table(s))] if s.settings
                    else [para("No configuration stored.")])]
    value = "suite accuracy" if s.suite is not None else "perplexity"
    out.append(_section("evolution", "Evolution", [image(
        figures["evolution"], "Evolution progress",
        f"Best and mean {value} per generation, the best so far, every evaluation (grey) and the baseline.")]))
    if s.suite is not None:
        lines = md.suite_run_lines(s)
        body = [para(lines[0]), bullets([line[2:] for line in lines[2:]])]
        if "suite" in figures:
            body.append(image(figures["suite"], "Accuracy per gene and point",
                              "Every gene's accuracy on every point (one seed) and its suite accuracy."))
        out.append(_section("suite", "Suite", body))
    if "program" in figures and s.best and s.best.get("program"):
        out.append(_section("program", "The best gene's program", [para(f"`{s.best['program']}`"),
                            image(figures["program"], "The best gene's program",
                                  "Each distinct node once, the inputs at the bottom, an arrow from each argument to "
                                  "the op that reads it.")]))
    if "pareto" in figures and s.multi_objective:
        body = [image(figures["pareto"], "Pareto front",
                      "Every finished evaluation on the first two objectives, the Pareto front as a step line, the "
                      "baseline as a star."), *(para(line) for line in md.pareto_lines(s))]
        if s.pareto["front"]:
            body.append(table(md.pareto_table(s)))
        if s.pareto["history"]:
            body += [para("Hypervolume after each generation (the evaluations of that generation and the ones "
                          "before):"), table(md.hypervolume_table(s))]
        out.append(_section("pareto", "Pareto front", body))
    if "distribution" in figures:
        out.append(_section("distribution", "Distribution of all evaluations", [image(
            figures["distribution"], "Distribution of all search evaluations",
            "Every finished search gene's suite accuracy, not just the best: where the baseline and the winner lie."
            if s.suite is not None else
            "Every finished search evaluation, not just the best: where the baseline and the winner lie.")]))
    if "curves" in figures and s.suite is None:  # a suite run has a curve per gene and point, none per gene
        out.append(_section("curves", "Learning curves", [image(
            figures["curves"], "Learning curves",
            "Training loss (solid) and validation loss (dashed) of the best genes and the baseline"
            + ("; dotted lines mark the rungs of the multi-fidelity schedule." if (s.fidelity or {}).get("rungs")
               else "."))]))
    gens = ([para("Best and mean are over the population after the generation (carried-over elites included)."),
             table(md.generations_table(s))] if s.history else [para("No generation finished yet.")])
    out.append(_section("generations", "Per generation", gens))
    top = [table(md.top_table(s))] if s.top(md.TOP_ROWS) else [para(f"{s.statement} No gene to rank.")]
    out.append(_section("top", f"Top {md.TOP_ROWS} genes", top))
    comp = [para(md.components_note(s))]
    if s.suite is None:
        comp.append(table(md.components_table(s)) if s.components else para(f"{s.statement} Nothing to analyse."))
    out.append(_section("components", "Component analysis", comp))
    if s.constraints:  # a run with caps: the genes over them
        lines = md.infeasible_lines(s)
        body = [para(lines[0])] + ([table(md.infeasible_table(s))] if len(lines) > 1 else [])
        out.append(_section("infeasible", "Infeasible genes", body))
    if s.racing:  # a raced run: every raced gene's seeds
        out.append(_section("racing", "Re-measured elites", [para(md.racing_lines(s)[0]), table(md.racing_table(s))]))
    return out


def _attachment_sections(s: RunSummary, a: Attachments) -> list[tuple[str, str, str]]:
    run_dir = Path(s.run_dir)
    out = []
    for i, v in enumerate(a.validations):
        split = "test split" if v.get("eval_split") == "test" else "validation split"
        stem = str(v["_file"]).rsplit(".", 1)[0]
        seeds = v.get("seeds") or []
        note = (f"{len(seeds)} trainings per gene with seeds {', '.join(map(str, seeds))} (never the search seed), "
                f"{v.get('steps')} steps each. {comparison_note(v)}")
        costs = md.cost_table(v)
        out.append(_section(f"validation-{i}", f"Multi-seed validation ({split})", [
            para(v.get("headline", "")), para(note, "muted"), table(md.validation_table(v)),
            *([para("Cost, the median over the seeds:"), table(costs)] if costs else []),
            image(run_dir / f"{stem}.png", "Per-seed values", "Every seed's value (points), box, mean (diamond) and "
                  "its confidence interval (bar); the dotted line is the baseline mean.")]))
    for i, ab in enumerate(a.ablations):
        stem = str(ab["_file"]).rsplit(".", 1)[0]
        out.append(_section(f"ablation-{i}", f"Ablation of {ab.get('str')}", [
            para("Each field in which the gene differs from the baseline, set back to the baseline's value "
                 "(without F) and added alone to the baseline (baseline + F). " + contribution_sign(ab), "muted"),
            table(md.ablation_table(ab)), bullets(contribution_lines(ab), "contrib"),
            *([para("Recipe or mechanism: the gene sets its own training recipe, so the four crossings of its "
                    "mechanism and recipe with the baseline's were trained on the same seeds.", "muted"),
               table(md.recipe_mechanism_table(ab)), bullets(recipe_mechanism_lines(ab), "contrib")]
              if md.recipe_mechanism_table(ab) else []),
            image(run_dir / f"{stem}.png", "Ablation contributions")]))
    for i, t in enumerate(a.transfers):
        stem = str(t["_file"]).rsplit(".", 1)[0]
        out.append(_section(f"transfer-{i}", "Transfer across scale", [
            para(t.get("headline", "")), para(transfer_note(t), "muted"), table(md.transfer_sizes_table(t)),
            table(md.transfer_table(t)), bullets(transfer_rule_lines()),
            image(run_dir / f"{stem}.png", "Transfer across scale", "Each gene's mean against its parameters at every "
                  "size (log axes), with the interval of the mean; the baseline is black.")]))
    for i, r in enumerate(a.suites):
        stem = str(r["_file"]).rsplit(".", 1)[0]
        out.append(_section(f"suite-{i}", md.suite_title(r), [
            para(r.get("headline", "")), table(md.suite_table(r)),
            image(run_dir / f"{stem}.png", "Accuracy per gene and point",
                  "Mean accuracy over the seeds per gene and point (± sd), the suite accuracy last.")]))
    if a.compare is not None:
        body = [para("From `compare_results.json`."),
                table(md.compare_table(a.compare)) if a.compare else para("The compare results list no entry.")]
        out.append(_section("compare", "Compare", body))
    for i, c in enumerate(a.curves):
        out.append(_section(f"curve-{i}", f"Difficulty curve: accuracy against {c.get('knob')} ({c.get('task')})", [
            para(md.curve_note(c), "muted"), table(md.curve_table(c)),
            image(_figure_in(run_dir, c["_dir"], CURVE_FIGURE), f"Accuracy against {c.get('knob')}",
                  "Each gene's mean accuracy at every value, its interval as a band; chance dashed, the break "
                  "threshold dotted.")]))
    for i, m in enumerate(a.maps):
        figures = [image(path, f"Attention maps of layer {layer.get('layer')}") for layer in m.get("layers", [])
                   if (path := _figure_in(run_dir, m["_dir"], layer.get("figure"))) is not None]
        title = "Attention maps" + (f" ({m['_dir']})" if m["_dir"] not in (".", "maps") else "")
        out.append(_section(f"maps-{i}", title, [para(md.maps_caption(m)), table(md.maps_table(m))] + figures))
    if a.problems:
        out.append(_section("problems", "Unreadable analysis files", [bullets(a.problems)]))
    return out


def _end_sections(s: RunSummary, a: Attachments) -> list[tuple[str, str, str]]:
    fails = [table(md.failures_table(s))] if s.failures else [para("No evaluation failed.")]
    repro = [bullets(md.reproduce_lines(s, str(s.run_dir), a))]
    versions = md.all_versions(s, a)
    if versions:
        repro += ["<h3>Package versions</h3>", table(md.versions_table(versions))]
    config = esc(md.full_config_json(s))
    repro += ["<h3>Full configuration</h3>",
              f"<details open><summary>All settings of the run</summary><pre>{config}</pre></details>"]
    if isinstance(s.data, Mapping) and s.data:
        data_text = json.dumps(s.data, indent=2, sort_keys=True, default=str)
        repro += [f"<details><summary>The data</summary><pre>{esc(data_text)}</pre></details>"]
    return [_section("failures", "Failures", fails), _section("reproducibility", "Reproducibility", repro)]


def render_html(s: RunSummary, attachments: Attachments | None = None,
                figures: Mapping[str, str | os.PathLike] | None = None) -> str:
    """The text of ``report.html``; ``figures`` maps 'evolution' (and 'distribution') to PNGs."""
    a = attachments or Attachments()
    figs = {k: Path(v) for k, v in (figures or {}).items()}
    figs.setdefault("evolution", Path(s.run_dir) / "evolution_progress.png")
    sections = ([_summary_section(s, a)] + _run_sections(s, figs) + _attachment_sections(s, a)
                + _end_sections(s, a))
    name = Path(str(s.run_dir)).name or str(s.run_dir)
    toc = "".join(f'<a href="#{anchor}">{esc(title)}</a>' for anchor, title, _ in sections)
    body = "".join(block for _, _, block in sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<link rel=\"icon\" href=\"data:,\">"
            f"<title>Evolution report: {esc(name)}</title><style>{STYLE}</style></head>"
            f"<body><main><h1>Evolution report: {esc(name)}</h1><nav class=\"toc\">{toc}</nav>{body}"
            "</main></body></html>\n")

