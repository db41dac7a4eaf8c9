"""Tables in the docs, generated from committed result files: every number traceable to a file.

A doc marks a generated block with the file it comes from and the table it shows:

    <!-- generated: docs/results/NAME/validation.json table=verdicts -->
    | ... the table ... |
    <!-- end generated -->

``python benchmarks/doc_tables.py`` rewrites every such block of the docs (README.md, docs/*.md)
from its file; ``--check`` changes nothing and exits 1 naming each block that differs from what
its file gives (``tests/test_doc_tables.py`` runs it, so a number edited by hand, or a result file
changed without regenerating the doc, fails the tests). Paths are relative to the repository root.

Tables (``table=``): a registered study's (``verdicts``, ``suite``, ``grid``, ``suite-rate``,
``search-top``, ``versus``, ``strategies``, ``rediscovery``, ``d4-family``) are
``evo_attention.report.studies.study_tables``'s, the renderers of ``evo-attention study report``
(``study check PLAN DOC`` checks a document's blocks of a plan's files); and these:

- ``costs``: a validation result's cost table;
- ``transfer``: a transfer ladder's table (``transfer.json``: every gene at every size, its rate,
  paired change, Holm p and verdict; the study's own renderer); a ladder without the current ``analysis``
  mark gets its verdicts and interaction tests by today's rule from its per-seed values;
- ``transfer-grid``: a transfer ladder's learning-rate grid tables, one per size;
- ``cost-rounds``: a ``benchmarks/cost_rounds.py`` summary (ms per step and step memory per gene
  and context length over interleaved rounds, the ratio to softmax and its call);
- ``batched``: a ``benchmarks/bench_batched.py`` result (trainings per hour per arm);
- ``curve``: a difficulty curve's table (``curve.json``);
- ``curve-seeds``: a difficulty curve's per-seed accuracies, every gene at every value;
- ``curve-verdicts``: a ``benchmarks/curve_verdicts.py`` result: each gene against the reference at
  one point of a curve, paired by seed (and the devices its seeds trained on, where the file has them);
  a file without the current ``analysis`` mark is recomputed by today's verdict rule from its per-seed values;
- ``signal-noise``: a ``benchmarks/signal_noise.py`` result: between-gene over within-gene spread
  per point (and the aggregate), or for a language-modelling result its one row;
- ``signal-noise-full``: ``signal-noise`` without the genes that cannot see every earlier key;
- ``signal-noise-genes``: the same result's per-gene means per point;
- ``suite-signal``: a ``benchmarks/suite_signal.py`` result;
- ``census``: a ``benchmarks/program_census.py`` result;
- ``climb``: a ``benchmarks/climb_mqar.py`` result (a search from the vanilla gene on MQAR);
- ``climb-lm``: a ``benchmarks/climb_lm.py`` result (searches from the vanilla gene on language);
- ``fitness-points``, ``fitness-improvements``: a fitness check's verdicts and per-point table, and
  its improvements' table (``evo-attention fitness-check``; ``report.studies.fitness``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# a registered study's tables (evo-attention study report) are the package's: one renderer each
from evo_attention.report.studies.study_tables import BLOCK, change_text as _change, num as _num, p_text as _p
from evo_attention.report.studies.study_tables import TABLES as STUDY_TABLES

ROOT = Path(__file__).resolve().parents[1]


def _markdown(headers, rows, align) -> str:
    from evo_attention.util.format import markdown_table

    return markdown_table(headers, rows, align)


def _validation(payload: dict) -> dict:
    from evo_attention.report.studies.validation import current_validation

    return current_validation(payload)


def transfer(payload: dict) -> str:
    from evo_attention.report.studies.transfer import current_transfer, transfer_table
    from evo_attention.studies.transfer import reference_of, transfer_statistics
    from evo_attention.util import stats
    from evo_attention.util.format import code, md_cell

    payload = current_transfer(payload)
    if payload.get("analysis") != stats.ANALYSIS:
        # an earlier rule's ladder: each gene's verdict and the interaction tests by today's rule, from the per-seed
        # values (as studies.transfer: Holm over every gene at every size against the baseline its verdict used)
        sizes, log = payload["sizes"], payload.get("metric", "val_perplexity") in stats.LOG_SCALE_METRICS
        rule = {"log": log, "margin": payload["margin"], "lower_is_better": payload["lower_is_better"],
                "confidence": payload["confidence"]}
        pairs = {(s["size"], g["gene"]): {"values": g["values"], "reference": reference_of(s, g)["values"]}
                 for s in sizes for g in s["genes"]}

        def now(key) -> dict:
            others = {k: pair for k, pair in pairs.items() if k != key}
            return stats.versus_reference({key: pairs[key]["values"]}, pairs[key]["reference"], others=others,
                                          **rule)[key]

        sizes = [{**s, "genes": [{**g, **now((s["size"], g["gene"]))} for g in s["genes"]]} for s in sizes]
        payload = {**payload, "sizes": transfer_statistics(sizes, rule["confidence"], log, rule["lower_is_better"])}
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


def costs(payload: dict) -> str:
    from evo_attention.report.studies.validation import cost_markdown

    return cost_markdown(_validation(payload)) or ""


def _ratio(s: dict) -> str:
    """A spread's ratio; undefined where neither the genes nor the seeds differ (a saturated task)."""
    if s["between_sd"] == 0 and s["within_sd"] == 0:
        return "undefined (all equal)"
    return _num(s["ratio"], 1)


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


def _devices(devices) -> str:
    """Where a gene's seeds trained: each device once, in seed order ("-" where not recorded)."""
    if not devices:
        return "-"
    return ", ".join(dict.fromkeys("-" if d is None else str(d) for d in devices))


def curve_verdicts(payload: dict) -> str:
    from evo_attention.report.studies.common import verdict_cell
    from evo_attention.util import stats
    from evo_attention.util.format import code

    reference, values = payload["reference"], payload["values"]
    # benchmarks/curve_verdicts.py's rule: the paired test on the raw scale at the file's margin, Holm over its genes
    compared = {n: values[n] for n in payload["comparisons"]}
    comparisons = stats.current_comparisons(payload, payload["comparisons"], compared, values[reference], log=False,
                                            margin=payload["margin"], lower_is_better=False)
    devices = payload.get("devices")  # a result written before they were recorded has none: no column
    headers = ["Gene", f"Accuracy at {payload['knob']}={payload['at']}, per seed {payload['seeds']}",
               "vs the reference: paired change [95% CI]", "Pairs", "p (Holm)", "Verdict", "Detectable effect"]
    rows = [[code(reference), _per_seed(values[reference]), "reference", "", "", "", ""]]
    for name, c in comparisons.items():
        rows.append([code(name), _per_seed(values[name]), _change(c), str(c["n_pairs"]), _p(c["p_holm"]),
                     verdict_cell(c), "-" if c.get("mde") is None else f"{c['mde']:.3f}"])
    if devices:
        headers.append("Trained on")
        for row, name in zip(rows, [reference, *comparisons]):
            row.append(_devices(devices.get(name)))
    return _markdown(headers, rows, "llrrrlr" + ("l" if devices else ""))


def fitness_points(payload: dict) -> str:
    """A fitness check (``fitness_check.json``): the vanilla gene per point, with its verdicts above."""
    from evo_attention.report.studies.fitness import points_table

    return "".join(f"- {v}\n" for v in payload["verdicts"]) + "\n" + points_table(payload)


def fitness_improvements(payload: dict) -> str:
    """A fitness check: each known improvement's effect and the probability one evaluation ranks it right."""
    from evo_attention.report.studies.fitness import improvements_table

    return improvements_table(payload)


def climb(payload: dict) -> str:
    """benchmarks/climb_mqar.py: per search seed the winner, its search and fresh accuracies, the
    training at which a program first reached the threshold, and whether the search solved the task."""
    from evo_attention.util.format import markdown_table

    rows = []
    for seed, row in payload["searches"].items():
        program = row["winner"].split("prog=", 1)[-1]
        fresh = ", ".join(f"{v:.3f}" for v in row["fresh_accuracy"].values())
        rows.append([seed, f"`{program}`", f"{row['search_accuracy']:.3f}", fresh,
                     row["first_training_at_threshold"] or "-", f"{row['trainings']}", "yes" if row["solved"] else "no"])
    rate = payload["solve_rate"]
    return (markdown_table(["search seed", "winner (program)", "search accuracy", "fresh accuracy (2 seeds)",
                            f"first training >= {payload['threshold']}", "trainings", "solved"], rows, "llrrrrl")
            + f"\nSolved in {payload['solved']} of {len(rows)} searches (exact 95% interval "
              f"{rate['ci_low']:.2f}-{rate['ci_high']:.2f}).\n")


def climb_lm(payload: dict) -> str:
    """benchmarks/climb_lm.py: per search seed the winner, its paired change against the vanilla gene
    on fresh seeds, the test's p, its verdict, and the search's fitness reliability (its fresh check)."""
    from evo_attention.util.format import markdown_table

    rows = []
    for seed, row in payload["searches"].items():
        program = row["winner"].split("prog=", 1)[-1]
        check = re.search(r"rank correlation[^:]*:\s*([+-]?[0-9.]+|n/a)", row.get("fresh_check") or "")
        held = "held" if (row.get("fresh_check") or "").startswith("the winner held") else "did not hold"
        ratio = f"{row['params_ratio']:.2f}x" if row.get("params_ratio") else "-"
        rows.append([seed, f"`{program}`", f"{100 * row['relative']:+.2f}%", f"{row['p_holm']:.3f}", row["verdict"], ratio,
                     f"{held}; rank correlation {check.group(1) if check else '-'}"])
    return (markdown_table(["search seed", "winner (program)", f"paired change ({payload['validate_seeds']} fresh seeds)",
                            "p", "verdict", "parameters vs the vanilla gene", "fresh check of the search (top 3)"],
                           rows, "llrrlrl")
            + f"\nNot worse than the vanilla gene in {payload['held']} of {payload['of']} searches.\n")


def census(payload: dict) -> str:
    """benchmarks/program_census.py: the share of random programs and of edits of the vanilla program
    with each feature, and the edit kinds drawn."""
    from evo_attention.util.format import markdown_table

    features = [k for k in payload["random_programs"] if k != "n"]
    rows = [[f, f"{payload['random_programs'][f]:.3f}", f"{payload['edits_of_vanilla'][f]:.3f}"] for f in features]
    kinds = ", ".join(f"{kind} {n}" for kind, n in payload["edit_kinds"].items())
    return (markdown_table([f"of {payload['n']} programs", "random draws", "one edit of vanilla"], rows, "lrr")
            + f"\nEdit kinds drawn: {kinds}.\n")


TABLES = {**STUDY_TABLES, "census": census, "climb": climb, "climb-lm": climb_lm, "fitness-points": fitness_points, "fitness-improvements": fitness_improvements,
          "suite-signal": suite_signal, "curve-verdicts": curve_verdicts, "curve-seeds": curve_seeds,
          "transfer": transfer, "transfer-grid": transfer_grid, "cost-rounds": cost_rounds, "curve": curve,
          "batched": batched, "signal-noise-full": signal_noise_full, "costs": costs, "signal-noise": signal_noise,
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
