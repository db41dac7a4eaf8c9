"""Tables in the docs, generated from committed result files: every number traceable to a file.

A doc marks a generated block with the file it comes from and the table it shows:

    <!-- generated: docs/results/NAME/validation.json table=verdicts -->
    | ... the table ... |
    <!-- end generated -->

``python benchmarks/doc_tables.py`` rewrites every such block of the docs (README.md, docs/*.md)
from its file; ``--check`` changes nothing and exits 1 naming each block that differs from what
its file gives (``tests/test_doc_tables.py`` runs it, so a number edited by hand, or a result file
changed without regenerating the doc, fails the tests). Paths are relative to the repository root.

Tables (``table=``):

- ``verdicts``: a validation result's verdict table (``validation.json``: the study's own renderer);
- ``grid``: its learning-rate grid table (each gene's mean per rate, the selected rate, edges);
- ``costs``: its cost table;
- ``transfer``: a transfer ladder's table (``transfer.json``: every gene at every size, its rate,
  paired change, Holm p and verdict; the study's own renderer);
- ``transfer-grid``: a transfer ladder's learning-rate grid tables, one per size;
- ``cost-rounds``: a ``benchmarks/cost_rounds.py`` summary (ms per step and step memory per gene
  and context length over interleaved rounds, the ratio to softmax and its call);
- ``strategies``: a ``benchmarks/strategies.py`` result: each strategy's validated winner per
  search seed, then each strategy against the reference strategy, paired by search seed;
- ``batched``: a ``benchmarks/bench_batched.py`` result (trainings per hour per arm);
- ``curve``: a difficulty curve's table (``curve.json``);
- ``curve-seeds``: a difficulty curve's per-seed accuracies, every gene at every value;
- ``suite``: a suite validation's table (``validation_suite.json``: the study's own renderer);
- ``suite-rate``: study 3's suite rate (``d1-rate/selected.json``: each rate's baseline mean, the
  selected one);
- ``search-top``: a search's best genes (``final_results.json``: its top 5 and the baseline, by the
  search's own metric on the search's one seed);
- ``curve-verdicts``: a ``benchmarks/curve_verdicts.py`` result: each gene against the reference at
  one point of a curve, paired by seed (and the devices its seeds trained on, where the file has them);
- ``signal-noise``: a ``benchmarks/signal_noise.py`` result: between-gene over within-gene spread
  per point (and the aggregate), or for a language-modelling result its one row;
- ``signal-noise-full``: ``signal-noise`` without the genes that cannot see every earlier key;
- ``signal-noise-genes``: the same result's per-gene means per point;
- ``versus``: a ``benchmarks/findings3_versus.py`` result: genes of one validation against a
  reference gene of another, paired by seed;
- ``rediscovery``: a ``benchmarks/rediscovery.py`` result: per feature and strategy, the searches whose
  winner (top 5) holds it, the evaluations until the first program holding it, the base rate; then
  each strategy against the reference;
- ``d4-family``: a ``benchmarks/findings3_family.py`` result: each cell's gene against its matched
  model with Holm over the cells (where the file has the family), then the trend over tokens per
  parameter.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- generated: (?P<file>\S+) table=(?P<table>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)",
                   re.S)


def _markdown(headers, rows, align) -> str:
    from evo_attention.util.format import markdown_table

    return markdown_table(headers, rows, align)


def _validation(payload: dict) -> dict:
    from evo_attention.report.studies.validation import current_validation

    return current_validation(payload)


def verdicts(payload: dict) -> str:
    from evo_attention.report.studies.validation import validation_table_markdown

    return validation_table_markdown(_validation(payload))


def grid(payload: dict) -> str:
    from evo_attention.report.studies.lr_grid import grid_section

    lines = grid_section(_validation(payload), "validation")
    return "\n".join(line for line in lines if line.startswith("|")) + "\n"


def transfer(payload: dict) -> str:
    from evo_attention.report.studies.transfer import transfer_table
    from evo_attention.util.format import code, md_cell

    headers, rows, align = transfer_table(payload)
    return _markdown(headers, [[code(c) if i == 1 else md_cell(c) for i, c in enumerate(row)] for row in rows], align)


def transfer_grid(payload: dict) -> str:
    from evo_attention.report.studies.lr_grid import grid_section

    return _grid_tables(grid_section(payload, "transfer"))


def _grid_tables(lines: list[str]) -> str:
    """The tables of a grid section, each after its size's heading as a bold line."""
    out = []
    for line in lines:
        if line.startswith("### "):
            out += ["", f"**{line[4:]}**", ""]
        elif line.startswith("|"):
            out.append(line)
    return "\n".join(out).strip("\n") + "\n"


def cost_rounds(payload: dict) -> str:
    from evo_attention.util.format import code

    headers = ["Gene", "T", "Batch", "ms / step, median [range]", "vs softmax, median [range]", "Call",
               "Step memory (MB, median)"]
    rows = []
    for r in payload["rows"]:
        ratio = ("1" if r["call"] == "reference"
                 else f"{r['ratio_median']:.2f} [{r['ratio_min']:.2f}, {r['ratio_max']:.2f}]")
        rows.append([f"{r['name']} ({code(r['gene'])})", str(r["seq_len"]), str(r["batch_size"]),
                     f"{r['ms_median']:.0f} [{r['ms_min']:.0f}, {r['ms_max']:.0f}]", ratio, r["call"],
                     _num(r["step_memory_mb_median"], 0)])
    return _markdown(headers, rows, "lrrrrlr")


def _reference_first(reference: str, names) -> list[str]:
    """The reference strategy, then the others in name order."""
    return [reference] + sorted(n for n in names if n != reference)


def strategies(payload: dict) -> str:
    from evo_attention.util.format import code

    seeds = payload["search_seeds"]
    names = _reference_first(payload["reference"], payload["searches"])
    headers = ["Search seed"] + [f"{n}: validated winner (mean of its fresh seeds)" for n in names]
    rows = []
    for seed in seeds:
        cells = [str(seed)]
        for n in names:
            w = payload["searches"][n][str(seed)]
            cells.append(f"{code(w['gene'])} {w['mean']:.3f}")
        rows.append(cells)
    first = _markdown(headers, rows, "l" + "r" * len(names))
    headers = ["Strategy", f"vs {payload['reference']}: paired change [95% CI]", "p (Holm)", "Verdict",
               "Detectable effect"]
    rows = []
    for n in names[1:]:
        c = payload["comparisons"][n]
        log = c.get("relative") is not None  # a linear-scale metric (suite accuracy) has none: units
        if log:
            mde = "-" if c.get("mde_relative") is None else f"{100 * c['mde_relative']:.2f}%"
        else:
            mde = "-" if c.get("mde") is None else f"{c['mde']:.4f}"
        rows.append([n, _change(c, log, digits=4), _p(c["p_holm"]), c["verdict_label"], mde])
    return first + "\n" + _markdown(headers, rows, "lrrlr")


def rediscovery(payload: dict) -> str:
    """Per feature: each strategy's searches whose winner holds it (Clopper-Pearson interval), whose
    top 5 does, the evaluations until the first program holding it, and the base rate of generation 0;
    then each strategy against the reference (Fisher, Holm over the features; Barnard beside)."""
    ref = payload["reference"]
    names = _reference_first(ref, payload["strategies"])
    headers = ["Feature", "Strategy", "Winner holds it", "Rate [95% CI]", "Top 5 holds it",
               "First evaluation holding it: median (range)", "Base rate (generation 0)"]
    rows = []
    for feature in payload["features"]:
        for n in names:
            r = payload["strategies"][n][feature]
            first = ("-" if r["first_evaluation_median"] is None else
                     f"{r['first_evaluation_median']:g} ({r['first_evaluation_range'][0]}-{r['first_evaluation_range'][1]})")
            base = "-" if r["base_rate"] is None else f"{r['base_rate']:.3f}"
            rows.append([feature, n, f"{r['solved']}/{r['n']}", f"{r['rate']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]",
                         f"{r['in_top_5']}/{r['n']}", first, base])
    first_table = _markdown(headers, rows, "llrrrrr")
    headers = ["Feature", "Strategy", f"Difference in rate vs {ref}", "p (Fisher)", f"p (Holm, {len(payload['features'])})",
               "p (Barnard, Holm)", "Words"]
    rows = []
    for n in names[1:]:
        for feature, c in payload["comparisons"][n].items():
            rows.append([feature, n, f"{c['difference']:+.2f}", _p(c["p_value"]), _p(c["p_holm"]),
                         _p(c["p_barnard_holm"]), c["words"]])
    return first_table + "\n" + _markdown(headers, rows, "llrrrrl")


def costs(payload: dict) -> str:
    from evo_attention.report.studies.validation import cost_markdown

    return cost_markdown(_validation(payload)) or ""


def _num(value, digits: int = 3) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}f}"


def _ratio(s: dict) -> str:
    """A spread's ratio; undefined where neither the genes nor the seeds differ (a saturated task)."""
    if s["between_sd"] == 0 and s["within_sd"] == 0:
        return "undefined (all equal)"
    return _num(s["ratio"], 1)


def _p(value) -> str:
    if value is not None and value != value:  # NaN: the test is undefined
        return "-"
    return "-" if value is None else (f"{value:.1e}" if value < 1e-3 else f"{value:.3f}")


def signal_noise(payload: dict) -> str:
    headers = ["Point", "Metric", "Between-gene sd", "Within-gene sd", "Ratio", "ANOVA F", "p"]
    rows = []
    if "points" in payload:
        for label, point in payload["points"].items():
            s = point["accuracy_spread"]
            rows.append([label, "accuracy", _num(s["between_sd"]), _num(s["within_sd"]), _ratio(s),
                         _num(s["anova_f"], 1), _p(s["anova_p"])])
        s = payload["aggregate"]["accuracy_spread"]
        rows.append([f"**{payload['suite']} (mean over points)**", "accuracy", _num(s["between_sd"]),
                     _num(s["within_sd"]), _ratio(s), _num(s["anova_f"], 1), _p(s["anova_p"])])
    else:
        s = payload["val_loss_spread"]
        rows.append([payload["data"], "validation loss", _num(s["between_sd"], 4), _num(s["within_sd"], 4),
                     _num(s["ratio"], 1), _num(s["anova_f"], 1), _p(s["anova_p"])])
    return _markdown(headers, rows, "llrrrrr")


def _spread(values: dict) -> dict:
    """benchmarks/signal_noise.py's own spread rule (one implementation)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("signal_noise", Path(__file__).resolve().parent / "signal_noise.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.spread(values)


FULL_VIEW_OUT = ("window-8",)  # genes that cannot see every earlier key


def signal_noise_full(payload: dict) -> str:
    """``signal-noise`` recomputed from the file's per-seed values without the genes of
    ``FULL_VIEW_OUT``: does a point separate the mechanisms that all see every earlier key?"""
    keep = [g for g in payload["genes"] if g not in FULL_VIEW_OUT]
    rows = []
    if "points" in payload:
        per_point = {label: {g: list(p["accuracy"][g].values()) for g in keep} for label, p in payload["points"].items()}
        for label, values in per_point.items():
            rows.append((label, "accuracy", _spread(values)))
        seeds = len(next(iter(next(iter(per_point.values())).values())))
        aggregate = {g: [sum((per_point[p][g][i] or 0.0) for p in per_point) / len(per_point) for i in range(seeds)]
                     for g in keep}
        rows.append((f"**{payload['suite']} (mean over points)**", "accuracy", _spread(aggregate)))
    else:
        rows.append((payload["data"], "validation loss", _spread({g: list(payload["val_loss"][g].values()) for g in keep})))
    digits = 3 if "points" in payload else 4
    return _markdown(["Point", "Metric", "Between-gene sd", "Within-gene sd", "Ratio", "ANOVA F", "p"],
                     [[label, metric, _num(s["between_sd"], digits), _num(s["within_sd"], digits), _ratio(s),
                       _num(s["anova_f"], 1), _p(s["anova_p"])] for label, metric, s in rows], "llrrrrr")


def signal_noise_genes(payload: dict) -> str:
    genes = list(payload["genes"])
    if "points" in payload:
        columns = {label: p["accuracy_spread"]["means"] for label, p in payload["points"].items()}
        columns[payload["suite"]] = payload["aggregate"]["accuracy_spread"]["means"]
        digits = 3
    else:
        columns = {payload["data"]: payload["val_loss_spread"]["means"]}
        digits = 4
    rows = [[g] + [_num(means.get(g), digits) for means in columns.values()] for g in genes]
    return _markdown(["Gene"] + list(columns), rows, "l" + "r" * len(columns))


def batched(payload: dict) -> str:
    """benchmarks/bench_batched.py's result: trainings per hour of each arm against its reference arm."""
    rows = []
    for name, c in payload["configs"].items():
        for arm in c["arms"]:
            auto = " (auto)" if arm["k"] == c["auto"]["models"] and arm.get("precision_setting", "auto") == "auto" else ""
            rows.append([name, arm["label"] + auto, arm["precision"], f"{arm['ms_per_step']:.1f}",
                         f"{arm['trainings_per_hour']:.1f}", f"{arm['vs_today']:.2f}x"])
    return _markdown(["Config", "Arm", "Precision", "ms / step (all its models)", "Trainings / hour", "vs reference"],
                     rows, "lllrrr")


def curve(payload: dict) -> str:
    from evo_attention.report.studies.curves import curve_table_markdown

    return curve_table_markdown(payload)


def _per_seed(values) -> str:
    """Per-seed accuracies in seed order; a failed training reads "failed"."""
    return ", ".join("failed" if v is None else f"{v:.3f}" for v in values)


def curve_seeds(payload: dict) -> str:
    from evo_attention.util.format import code

    values = payload["values"]
    headers = ["Gene"] + [f"{payload['knob']}={v}" for v in values]
    rows = []
    for gene in payload["genes"]:
        cells = [code(gene["gene"])]
        for point in gene["points"]:
            cells.append(_per_seed(point["accuracy"]))
        rows.append(cells)
    return _markdown(headers, rows, "l" + "r" * len(values))


def suite_signal(payload: dict) -> str:
    """benchmarks/suite_signal.py: per point the baseline's seeds, mean and sd against chance, the
    no-recall level and the ceiling, its flags and signal over noise."""
    headers = ["Point", "Steps", "Chance", "No-recall", "Baseline per seed", "Mean (sd)", "In band", "Informative",
               "Signal/noise", "Wall s"]
    rows = []
    for label, point in payload["points"].items():
        base = point["baseline"]
        seeds = point["genes"][base["name"]]["accuracy"]
        sd = "-" if base["sd"] is None else f"{base['sd']:.3f}"
        rows.append([label, str(point["steps"]), _num(point["chance_accuracy"]),
                     _num(point.get("no_recall_accuracy")), _per_seed(seeds.values()),
                     f"{_num(base['mean'])} ({sd})", "yes" if base["in_band"] else "no",
                     "yes" if base["informative"] else "no", _num(base["signal_over_noise"], 1),
                     f"{point['wall_s']:.0f}"])
    return _markdown(headers, rows, "lrrrlrllrr")


def suite(payload: dict) -> str:
    from evo_attention.report.studies.suite import suite_table
    from evo_attention.util.format import code, md_cell

    headers, rows, align = suite_table(_validation(payload))
    return _markdown(headers, [[code(c) if i == 1 else md_cell(c) for i, c in enumerate(row)] for row in rows], align)


def suite_rate(payload: dict) -> str:
    """Study 3's suite rate (findings3.sh d1-rate's selected.json): each rate's baseline mean suite
    accuracy on the tuning seeds, the selected one marked."""
    headers = ["Learning rate", "Baseline mean suite accuracy", "Selected"]
    rows = [[r, _num(payload["baseline_mean"][r], 4), "**yes**" if r == payload["selected"] else ""]
            for r in payload["rates"]]
    return _markdown(headers, rows, "lrl")


def search_top(payload: dict) -> str:
    from evo_attention.util.format import code

    metric = "suite_accuracy" if payload.get("suite") else "perplexity"
    headers = ["Rank", "Gene", "Generation", "Suite accuracy" if metric == "suite_accuracy" else "Perplexity"]
    rows = [[str(i), code(g["gene"]), str(g["generation"]), _num(g[metric], 4)]
            for i, g in enumerate(payload["top_5"], start=1)]
    base = payload.get("baseline") or {}
    if base:
        rows.append(["baseline", code(base["gene"]), "-", _num(base.get(metric), 4)])
    return _markdown(headers, rows, "llrr")


def _change(c: dict, log: bool = False, digits: int = 3) -> str:
    """A paired comparison's change with its 95% interval ("-" where it has none); a difference of
    logs as the relative change it is (exp(d) - 1, in percent); else the difference in the metric's
    units, to ``digits`` decimals."""
    if c["diff_ci_low"] is None:
        return "-"
    if log:
        low, mid, high = (100 * math.expm1(c[k]) for k in ("diff_ci_low", "difference", "diff_ci_high"))
        return f"{mid:+.2f}% [{low:+.2f}, {high:+.2f}]"
    return f"{c['difference']:+.{digits}f} [{c['diff_ci_low']:+.{digits}f}, {c['diff_ci_high']:+.{digits}f}]"


def _devices(devices) -> str:
    """Where a gene's seeds trained: each device once, in seed order ("-" where not recorded)."""
    if not devices:
        return "-"
    return ", ".join(dict.fromkeys("-" if d is None else str(d) for d in devices))


def curve_verdicts(payload: dict) -> str:
    from evo_attention.util.format import code

    reference = payload["reference"]
    devices = payload.get("devices")  # a result written before they were recorded has none: no column
    headers = ["Gene", f"Accuracy at {payload['knob']}={payload['at']}, per seed {payload['seeds']}",
               "vs the reference: paired change [95% CI]", "Pairs", "p (Holm)", "Verdict", "Detectable effect"]
    rows = [[code(reference), _per_seed(payload["values"][reference]), "reference", "", "", "", ""]]
    for name, c in payload["comparisons"].items():
        rows.append([code(name), _per_seed(payload["values"][name]), _change(c), str(c["n_pairs"]), _p(c["p_holm"]),
                     c["verdict_label"], "-" if c.get("mde") is None else f"{c['mde']:.3f}"])
    if devices:
        headers.append("Trained on")
        for row, name in zip(rows, [reference, *payload["comparisons"]]):
            row.append(_devices(devices.get(name)))
    return _markdown(headers, rows, "llrrrlr" + ("l" if devices else ""))


def versus(payload: dict) -> str:
    """A ``benchmarks/findings3_versus.py`` result: each gene of the first file against the reference
    gene of the second, paired by seed (mean, paired change with its interval, test, Holm p, the
    equivalence test's Holm p at the margin, verdict)."""
    from evo_attention.util.format import code

    def mean(values) -> str:
        kept = [v for v in values if v is not None]
        return _num(sum(kept) / len(kept), 4) if kept else "-"

    # the scored split and the metric's name where the file records them ("val_perplexity" is the
    # metric's name on any split)
    metric = (f"{payload['eval_split']} {payload['metric_label']}" if payload.get("metric_label") and payload.get("eval_split")
              else (payload.get("metric") or "value").replace("_", " "))
    headers = ["Gene", f"Mean {metric} ({len(payload['seeds'])} seeds)",
               "vs the reference: paired change [95% CI]", "Test", "p (Holm)",
               f"Equivalence p (Holm, margin {payload['margin']:g})", "Verdict"]
    rows = [[code(payload["reference"]), mean(payload["reference_values"]), "reference", "", "", "", ""]]
    for name, c in payload["genes"].items():
        rows.append([code(name), mean(c["values"]), _change(c, payload.get("log", False)), str(c["test"]), _p(c["p_holm"]), _p(c["p_tost_holm"]),
                     c["verdict_label"]])
    return _markdown(headers, rows, "lrrlrrl")


def d4_family(payload: dict) -> str:
    """The cells (paired change of the gene against its matched model, exact and t p, Holm over the
    cells, the equivalence test's Holm p, verdict), then the trend: the mean per-seed slope of the log
    change on log2 of tokens per parameter (as a relative change per doubling) and its tests."""
    parts = []
    if "family" in payload:
        size = len(payload["family"])
        headers = ["Cell", "Matched FFN", "Pairs", "Paired change [95% CI]", "p (exact)", "p (t)",
                   f"p (Holm, {size})", f"Equivalence p (Holm, ±{100 * payload['margin']:g}%)", "Verdict"]
        rows = [[name, str(c.get("d_ff") or "-"), str(c["n_pairs"]), _change(c, log=True), _p(c["p_exact"]),
                 _p(c["p_t"]), _p(c["p_holm"]), _p(c["p_tost_holm"]), c["verdict_label"]]
                for name, c in payload["family"].items()]
        parts.append(_markdown(headers, rows, "lrrrrrrrl"))
    if "trend" in payload:
        t = payload["trend"]
        cells = ", ".join(f"{name} ({level:g})" for name, level in t["cells"].items())
        per_doubling = "-" if t["mean_slope"] is None else f"{100 * math.expm1(t['mean_slope']):+.2f}%"
        headers = ["Trend cells (tokens per parameter)", "Seeds", "Slopes per seed (log change per doubling)",
                   "Mean slope", "Per doubling", "p (exact sign-flip)", "p (t)", "Words"]
        rows = [[cells, str(len(t["seeds"])), ", ".join(f"{v:+.4f}" for v in t["slopes"]),
                 _num(t["mean_slope"], 4), per_doubling, _p(t["p_exact"]), _p(t["p_t"]), t["words"]]]
        parts.append(_markdown(headers, rows, "lrlrrrrl"))
    return "\n".join(parts)


TABLES = {"d4-family": d4_family, "rediscovery": rediscovery, "versus": versus, "suite-signal": suite_signal, "verdicts": verdicts, "curve-verdicts": curve_verdicts, "curve-seeds": curve_seeds, "suite": suite, "search-top": search_top, "suite-rate": suite_rate, "transfer": transfer, "transfer-grid": transfer_grid, "cost-rounds": cost_rounds, "strategies": strategies, "curve": curve, "batched": batched, "signal-noise-full": signal_noise_full, "grid": grid, "costs": costs, "signal-noise": signal_noise,
          "signal-noise-genes": signal_noise_genes}


def docs(root: Path) -> list[Path]:
    return [p for p in [root / "README.md"] + sorted((root / "docs").glob("*.md")) if p.is_file()]


def render(match: re.Match, doc: Path, root: Path) -> str:
    name, path = match["table"], root / match["file"]
    if name not in TABLES:
        raise SystemExit(f"{doc.relative_to(root)}: unknown table {name!r}; tables: {', '.join(TABLES)}")
    if not path.is_file():
        raise SystemExit(f"{doc.relative_to(root)}: result file {match['file']} does not exist")
    return TABLES[name](json.loads(path.read_text(encoding="utf-8")))


def run(check: bool, root: Path = ROOT) -> list[str]:
    """The blocks that differ from their files (``check``), else rewrite them; returns their names."""
    differ = []
    for doc in docs(root):
        text = doc.read_text(encoding="utf-8")

        def fill(match: re.Match) -> str:
            body = render(match, doc, root)
            if body != match["body"]:
                differ.append(f"{doc.relative_to(root)}: {match['file']} table={match['table']}")
            return match.group(1) + body + match.group(5)

        new = BLOCK.sub(fill, text)
        if not check and new != text:
            doc.write_text(new, encoding="utf-8")
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs from its file")
    args = parser.parse_args()
    differ = run(args.check)
    for name in differ:
        print(("differs from its file: " if args.check else "regenerated: ") + name)
    if args.check and differ:
        sys.exit(1)


if __name__ == "__main__":
    main()
