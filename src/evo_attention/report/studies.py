"""How a study's result reads: the tables and markdown of validate, ablate, compare and difficulty
curve results (and of a learning-rate grid, for any of them: ``grid_section``; of genes on a suite
of tasks, for compare and validate: ``suite_markdown``).

The studies (``evo_attention.studies``) write their ``*.md`` files with these functions, and the
run report renders the same tables from the ``*.json`` files they left, so the two always agree.
Everything here reads plain result dicts (as written to JSON); nothing imports a study.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

from evo_attention.genes import AttentionGene, recipe_of
from evo_attention.report.attachments import COMPARE_FIGURE, CURVE_FIGURE, load_attachments, output_stem
from evo_attention.train.config import describe_schedule
from evo_attention.util import stats
from evo_attention.util.errors import UserError
from evo_attention.util.format import code, fmt, markdown_table, md_cell, number


# metric -> (label, lower is better)
METRICS = {"val_perplexity": ("perplexity", True), "val_loss": ("loss", True), "accuracy": ("accuracy", False),
           "bits_per_byte": ("bits per byte", True), "bits_per_char": ("bits per character", True),
           "suite_accuracy": ("suite accuracy", False)}  # the mean accuracy over a suite's points (train.suite)
# gene field -> how an ablation names it
FIELD_LABELS = {"similarity": "similarity", "normalization": "normalization", "gating": "gating",
                "temperature_mode": "temperature", "use_bias": "bias", "attention_dropout": "attention dropout",
                "learning_rate": "learning rate", "warmup": "warm-up", "weight_decay": "weight decay"}


def schedule_text(config: Mapping | None, steps: int | None = None, *, grid: Sequence[float] = (),
                  genes: Iterable[str] = ()) -> str:
    """The learning-rate schedule a study's trainings ran, in words: ``train.config.describe_schedule``
    of its stored config over ``steps`` (default its ``train_steps``). With a learning-rate ``grid``
    the rate is each gene's own of it; when one of ``genes`` sets its own recipe parts (lr=, wu=,
    wd=), the sentence says that they replace the run's for that gene."""
    text = describe_schedule(config or {}, steps)
    if grid:
        text = f"lr each gene's own best of {', '.join(f'{r:g}' for r in grid)}, " + text.partition(", ")[2]
    if any(recipe_of(key) for key in genes if _parses(key)):
        text += "; a gene's own recipe parts (lr=, wu=, wd= in its key) replace these for that gene"
    return text


def _parses(key: str) -> bool:
    try:
        AttentionGene.parse(key)
    except ValueError:  # a key naming a plugin's component that is not loaded here
        return False
    return True


def metric_info(metric: str, eval_split: str = "valid") -> tuple[str, bool, str]:
    """(label, lower_is_better, axis text) of a metric name."""
    if metric not in METRICS:
        raise UserError(f"unknown metric {metric!r}: use one of {', '.join(METRICS)}")
    label, lower = METRICS[metric]
    split = "validation" if eval_split == "valid" else eval_split
    return label, lower, f"{split} {label} ({'lower' if lower else 'higher'} is better)"


def interval(low, high, digits: int) -> str:
    return "-" if low is None or high is None else f"[{fmt(low, digits)}, {fmt(high, digits)}]"


def digits_for(metric: str) -> int:
    return 4 if metric in ("val_loss", "accuracy", "bits_per_byte", "bits_per_char", "suite_accuracy") else 3


def change_text(row: Mapping, metric: str) -> str:
    """A gene's paired change from the baseline with its interval: relative (in %) on a ratio
    metric's log scale, else in the metric's units."""
    if row.get("scale") == "log" and row.get("relative") is not None:
        low, high = row.get("relative_ci_low"), row.get("relative_ci_high")
        span = "" if low is None or high is None else f" [{100 * low:+.2f}, {100 * high:+.2f}]"
        return f"{100 * row['relative']:+.2f}%{span}"
    if row.get("difference") is None:
        return "-"
    d = digits_for(metric)
    return f"{row['difference']:+.{d}f} {interval(row.get('diff_ci_low'), row.get('diff_ci_high'), d)}"


def welch_change_text(row: Mapping) -> str:
    """The unpaired (Welch) difference the paired one replaces, in % of the baseline's mean."""
    w = row.get("welch") or {}
    if w.get("difference_percent") is None:
        return "-"
    low, high = w.get("diff_ci_low_percent"), w.get("diff_ci_high_percent")
    span = "" if low is None or high is None else f" [{low:+.2f}, {high:+.2f}]"
    return f"{w['difference_percent']:+.2f}%{span}"


def verdict_cell(row: Mapping) -> str:
    """The verdict as a table shows it: the word with its margin, and for an undetermined one what
    these seeds could detect and how many would decide it."""
    label = str(row.get("verdict_label") or row.get("verdict") or "")
    if row.get("verdict") != stats.UNDETERMINED:
        return label
    parts = []
    if row.get("mde_relative") is not None:
        parts.append(f"detects ±{100 * row['mde_relative']:.1f}%")
    elif row.get("mde") is not None:
        parts.append(f"detects ±{row['mde']:.3g}")
    needed = row.get("seeds_for_equivalence")
    parts.append(f"~{needed} seeds to decide" if needed is not None else "more seeds than planned to decide")
    return f"{label} ({'; '.join(parts)})"


def margin_text(result: Mapping) -> str:
    margin = result.get("margin", stats.DEFAULT_MARGIN)
    if result.get("metric", "val_perplexity") in stats.LOG_SCALE_METRICS:
        return f"±{100 * margin:g}%"
    return f"±{margin:g}"


def validation_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of the validation table; cells are plain text, the first column the
    gene key (the baseline first)."""
    d = digits_for(result.get("metric", ""))
    conf = stats.percent(result.get("confidence", 0.95))
    search_seed = result.get("search_seed")
    show_search = any(r.get("search_value") is not None for r in result.get("genes", []))
    family = result.get("family_size") or len(result.get("genes", []))
    rates = grid_rates(result)
    headers = ["Gene", "Seeds ok"] + (["lr"] if rates else []) + ["Mean ± sd", f"{conf} CI"]
    headers += ["Search" + (f" (seed {search_seed})" if search_seed is not None else "")] if show_search else []
    headers += [f"Paired change [{conf} CI]", "Unpaired (Welch)", "p (paired)", f"p (Holm, {family})", "Verdict"]
    rows = []
    for r in [result.get("baseline") or {}] + list(result.get("genes", [])):
        is_base = r is result.get("baseline")
        n_ok = len(r.get("values") or []) - (r.get("n_failed") or 0)
        cells = [str(r.get("gene", "")), f"{n_ok}/{len(r.get('values') or [])}"]
        cells += [rate_cell(rates.get(r.get("gene")))] if rates else []
        cells += [f"{fmt(r.get('mean'), d)} ± {fmt(r.get('sd'), d)}", interval(r.get("ci_low"), r.get("ci_high"), d)]
        cells += [fmt(r.get("search_value"), d)] if show_search else []
        if is_base:
            cells += ["-"] * 4 + ["baseline (reference)"]
        else:
            cells += [change_text(r, result.get("metric", "")), welch_change_text(r), p_text(r.get("p_value")),
                      p_text(r.get("p_holm")), verdict_cell(r)]
        rows.append(cells)
    align = "l" + "r" * (len(headers) - 2) + "l"
    return headers, rows, align


def best_row(result: Mapping) -> dict | None:
    """The validated gene with the best mean (None if none has a value)."""
    rows = [r for r in result.get("genes", []) if r.get("mean") is not None]
    if not rows:
        return None
    sign = 1 if result.get("lower_is_better", True) else -1
    return min(rows, key=lambda r: (sign * r["mean"], r["gene"]))


def headline(result: Mapping) -> str:
    """One sentence: the best validated gene vs the baseline, its paired change with the interval,
    and the verdict with its numbers."""
    best, base = best_row(result), result.get("baseline") or {}
    label, conf, d = result.get("metric_label", "perplexity"), stats.percent(result.get("confidence", 0.95)), \
        digits_for(result.get("metric", ""))
    seeds = result.get("seeds") or []
    split = "validation" if result.get("eval_split") == "valid" else str(result.get("eval_split"))
    span = f"{len(seeds)} seeds ({seeds[0]}..{seeds[-1]})" if seeds else "no seeds"
    if best is None:
        return f"No validated gene finished a training ({span}, {split} split)."
    text = (f"{best.get('str', best.get('gene'))} {split} {label} {fmt(best['mean'], d)} {conf} CI "
            f"{interval(best.get('ci_low'), best.get('ci_high'), d)}"
            f" vs baseline {fmt(base.get('mean'), d)} {interval(base.get('ci_low'), base.get('ci_high'), d)}")
    if best.get("difference") is not None:
        text += f"; paired change {change_text(best, result.get('metric', ''))}"
    if best.get("p_holm") is not None:
        family = result.get("family_size") or len(result.get("genes", []))
        text += f", Holm p = {best['p_holm']:.3g} over {family} comparison{'s' if family != 1 else ''}"
    return text + f" over {span}: **{verdict_cell(best)}**."


def read_studies(run_dir):
    """The study results in ``run_dir`` (``load_attachments``), each validation read by the current
    rule: one made by an earlier version is recomputed from its per-seed values and marked so."""
    found = load_attachments(run_dir)
    found.validations[:] = [current_validation(v) for v in found.validations]
    return found


def current_validation(result: Mapping) -> dict:
    """``result`` as the current rule reads it (``stats.recompute_validation``), headline included."""
    if result.get("analysis") == stats.ANALYSIS:
        return dict(result)
    upgraded = stats.recompute_validation(result)
    if upgraded.get("recomputed"):
        upgraded["headline"] = headline(upgraded) + " (recomputed from the stored per-seed values)"
    return upgraded


def cost_table(result: Mapping) -> tuple[list[str], list[list[str]], str] | None:
    """(headers, rows, align) of what each validated gene costs (medians over its seeds), or None
    for a result without costs (one written before they were kept)."""
    rows_in = [result.get("baseline") or {}] + list(result.get("genes", []))
    if not any(r.get("cost") for r in rows_in):
        return None
    base = rows_in[0].get("cost") or {}
    columns = {"params": ",.0f", "flops": ".3g", "train_ms_per_step": ".1f", "latency_ms": ".1f"}  # cost -> format
    headers = ["Gene", "Params", "FLOPs / train step", "Train ms / step", "Latency ms"]
    rows = []
    for i, r in enumerate(rows_in):
        cost = r.get("cost") or {}
        cells = [str(r.get("gene", ""))]
        for name, spec in columns.items():
            value, ref = cost.get(name), base.get(name)
            relative = i > 0 and value is not None and ref  # a gene's cost against the baseline's (row 0)
            cells.append(number(value, spec) + (f" ({value / ref:.2f}x)" if relative else ""))
        rows.append(cells)
    return headers, rows, "l" + "r" * (len(headers) - 1)


def p_text(value) -> str:
    return "-" if value is None else ("< 0.0001" if value < 1e-4 else f"{value:.4f}")


def verdict_markdown(result: Mapping) -> str:
    """The verdict table of a validation result, as ``validation.md`` (and the docs) show it."""
    headers, rows, align = validation_table(result)
    md_rows = [[md_cell(c) if i != 0 else code(c) for i, c in enumerate(row)] for row in rows]
    return markdown_table(headers, md_rows, align).rstrip() + "\n"


def cost_markdown(result: Mapping) -> str | None:
    """The cost table of a validation result as markdown; None for a result without costs."""
    costs = cost_table(result)
    if not costs:
        return None
    headers, rows, align = costs
    return markdown_table(headers, [[code(c) if i == 0 else c for i, c in enumerate(row)] for row in rows],
                          align).rstrip() + "\n"


def validation_markdown(result: Mapping) -> str:
    """The text of ``validation.md``."""
    seeds = result.get("seeds") or []
    lines = [
        "# Multi-seed validation", "",
        result.get("headline", ""), "",
        f"Every gene and the vanilla baseline were trained {len(seeds)} times, with seeds {', '.join(map(str, seeds))} "
        f"({seed_note(result)}), "
        f"{result.get('steps')} steps each, and measured on the {result.get('eval_split')} split. "
        f"{comparison_note(result)}" + (f" {GRID_SENTENCE}" if result.get("grid") else ""), "",
        f"Learning-rate schedule: {study_schedule(result)}.", "",
        verdict_markdown(result).rstrip(), "",
    ]
    costs = cost_markdown(result)
    if costs:
        lines += ["What each gene costs, the median over its seeds (in brackets: relative to the baseline). "
                  "FLOPs count one training step's arithmetic; times are those of the machine and executor that "
                  "trained it; latency is one eval-mode forward pass of an evaluation batch.", "",
                  costs.rstrip(), ""]
    failures = [(r["gene"], e) for r in [result.get("baseline") or {}] + list(result.get("genes", []))
                for e in r.get("errors", [])]
    if failures:
        lines += ["Failed trainings (left out of the statistics):", ""]
        lines += [f"- `{g}`: {md_cell(e)}" for g, e in failures] + [""]
    lines += [f"![Per-seed values]({output_stem('validation', result.get('eval_split', 'valid'))}.png)", ""]
    lines += grid_section(result, "validation")
    return "\n".join(lines)


def study_schedule(result: Mapping, steps: int | None = None) -> str:
    """``schedule_text`` of a validation- or ablation-shaped result (its config, steps, grid and genes)."""
    genes = [r.get("gene") for r in list(result.get("genes") or []) + list(result.get("variants") or [])]
    steps = steps if steps is not None else result.get("steps") if isinstance(result.get("steps"), int) else None
    return schedule_text(result.get("config"), steps, grid=(result.get("grid") or {}).get("rates") or (),
                         genes=[str(g) for g in genes if g])


def _genes(n: int) -> str:
    return "1 gene" if n == 1 else f"{n} genes"


def comparison_note(result: Mapping) -> str:
    """How the comparisons of a validation-shaped result were made, in words."""
    family = result.get("family_size") or len(result.get("genes", []))
    log = result.get("metric", "val_perplexity") in stats.LOG_SCALE_METRICS
    scale = "of the log values (the change is relative)" if log else "of the values"
    recomputed = (" These comparisons were recomputed by the current rule from the per-seed values of a result "
                  "written by an earlier version." if result.get("recomputed") else "")
    return (f"Each gene is compared with the baseline seed by seed (both trained on the same seeds): a paired "
            f"t-test on the per-seed differences {scale}, with its t interval (a bootstrap interval is in the "
            f"JSON); the unpaired Welch interval it replaces is shown beside it. p (Holm) is corrected over the "
            f"{family} comparison{'s' if family != 1 else ''} made against these baseline trainings. The verdict: "
            f"better or worse when the Holm p < {1 - result.get('confidence', 0.95):.2g}; else equivalent within "
            f"{margin_text(result)} when the equivalence test (TOST, Holm-corrected) says so; else undetermined, with "
            f"the effect these seeds could detect (power 0.8) and about how many seeds would decide it."
            + recomputed)


def seed_note(result: Mapping) -> str:
    if result.get("search_seed") is not None:
        return f"not the search seed {result['search_seed']}, on which the search picked its winners"
    seed = (result.get("config") or {}).get("seed")
    return f"seed + 1 ... seed + N of the configured seed {seed}, which itself is left out"


def ablation_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of the ablation table in plain text."""
    d = digits_for(result.get("metric", ""))
    conf = stats.percent(result.get("confidence", 0.95))
    rates = grid_rates(result)
    headers = ["Variant", "What changed", "Key", "Seeds ok"] + (["lr"] if rates else []) + [
        f"Mean [{conf} CI]", "Δ vs full gene", "p (Holm)", "Δ vs baseline", "p (Holm)"]
    rows = []
    for r in result.get("variants", []):
        n = len(r.get("values") or [])
        crossed = r.get("kind") in ("mechanism", "recipe")  # a cell of the recipe-or-mechanism 2x2
        change = str(r.get("change")).split(": ", 1)[-1] if r.get("field") or crossed else "-"
        cells = [str(r.get("name")), change, str(r.get("gene")), f"{n - (r.get('n_failed') or 0)}/{n}"]
        cells += [rate_cell(rates.get(r.get("gene")))] if rates else []
        cells += [f"{fmt(r.get('mean'), d)} {interval(r.get('ci_low'), r.get('ci_high'), d)}"]
        for key in ("vs_full", "vs_baseline"):
            c = r.get(key)
            if not c or c.get("difference") is None:
                cells += ["-", "-"]
            else:
                cells += [change_text(c, result.get("metric", "")), p_text(c.get("p_holm"))]
        rows.append(cells)
    return headers, rows, "lllr" + ("r" if rates else "") + "rrrrr"


def contribution_lines(result: Mapping) -> list[str]:
    """Plain sentences: what each field contributes, strongest first."""
    d = digits_for(result.get("metric", ""))
    label = result.get("metric_label", "perplexity")
    alpha = 1.0 - float(result.get("confidence", 0.95))
    lines = []
    relative = result.get("analysis") == stats.ANALYSIS and result.get("metric", "val_perplexity") in stats.LOG_SCALE_METRICS

    def amount(c: Mapping) -> str:
        if relative:
            span = "" if c.get("low") is None else f" [{100 * c['low']:+.2f}%, {100 * c['high']:+.2f}%]"
            return f"{100 * c['value']:+.2f}%{span}"
        return f"{c['value']:+.{d}f} {interval(c.get('low'), c.get('high'), d)}"

    total = result.get("total") or {}
    if total.get("value") is not None:
        lines.append(f"Whole gene vs baseline: {label} improves by {amount(total)} "
                     f"({_significance(total, alpha, result.get('confidence', 0.95))}).")
    for kind, text in (("remove", "removing it from the gene costs"), ("add", "adding it alone to the baseline gains")):
        items = [c for c in result.get("contributions", []) if c["kind"] == kind and c.get("value") is not None]
        for c in sorted(items, key=lambda c: -c["value"]):
            lines.append(f"{c['change']}: {text} {amount(c)} ({_significance(c, alpha, result.get('confidence', 0.95))}).")
    return lines


def _significance(c: Mapping, alpha: float, confidence: float) -> str:
    if c.get("p_holm") is not None and c["p_holm"] < alpha:
        return f"significant at {stats.percent(confidence)} after Holm's correction"
    if c.get("low") is not None and (c["low"] > 0 or c["high"] < 0):
        return "its own interval excludes 0, but not significant after Holm's correction"
    return "not distinguishable from 0"


# -- recipe or mechanism: the 2x2 of an ablated gene that sets its own recipe -----------------------
RECIPE_CELLS = (("neither", "baseline"), ("mechanism", "mechanism alone (the gene's mechanism, the baseline's recipe)"),
                ("recipe", "recipe alone (the baseline, the gene's recipe)"), ("both", "the gene"))


def recipe_mechanism_table(result: Mapping) -> tuple[list[str], list[list[str]], str] | None:
    """(headers, rows, align) of the 2x2 (mean and interval of each cell), None without one."""
    block = result.get("recipe_vs_mechanism")
    if not block:
        return None
    d = digits_for(result.get("metric", ""))
    cells = block.get("cells") or {}

    def cell(name: str) -> str:
        c = cells.get(name) or {}
        return f"{fmt(c.get('mean'), d)} {interval(c.get('ci_low'), c.get('ci_high'), d)}"

    headers = ["Mechanism (rows), recipe (columns)", "the baseline's recipe",
               f"the gene's recipe ({block.get('parts_text')})"]
    rows = [["the baseline's mechanism", cell("neither"), cell("recipe")],
            ["the gene's mechanism", cell("mechanism"), cell("both")]]
    return headers, rows, "lrr"


def _share_amount(share: Mapping, block: Mapping, metric: str) -> str:
    """A share (positive = better) with its interval: in % on the log scale, else in the metric's units."""
    if block.get("scale") == "log" and share.get("relative") is not None:
        low, high = share.get("relative_ci_low"), share.get("relative_ci_high")
        span = "" if low is None or high is None else f" [{100 * low:+.2f}%, {100 * high:+.2f}%]"
        return f"{100 * share['relative']:+.2f}%{span}"
    if share.get("mean") is None:
        return "-"
    d = digits_for(metric)
    return f"{share['mean']:+.{d}f} {interval(share.get('ci_low'), share.get('ci_high'), d)}"


def _gain(value, block: Mapping, metric: str, lower: bool) -> str:
    if value is None:
        return "-"
    if block.get("scale") == "log":
        return f"{100 * (-math.expm1(-value) if lower else math.expm1(value)):+.2f}%"
    return f"{value:+.{digits_for(metric)}f}"


def recipe_mechanism_lines(result: Mapping) -> list[str]:
    """Plain sentences: the gene's advantage, the recipe's share and the mechanism's (each with
    its gain alone and with the other), the interaction test, and which share is the larger."""
    block = result.get("recipe_vs_mechanism")
    if not block:
        return []
    metric, lower = result.get("metric", ""), result.get("lower_is_better", True)
    alpha = 1.0 - float(result.get("confidence", 0.95))
    shares, label = block.get("shares") or {}, result.get("metric_label", "perplexity")

    def p(value) -> str:
        return "p -" if value is None else f"p {p_text(value)}"

    total = shares.get("total") or {}
    lines = [f"Whole advantage of the gene over the baseline: {label} improves by "
             f"{_share_amount(total, block, metric)} ({p(total.get('p_value'))}, {block.get('n')} paired seeds"
             + (f", {block['n_dropped']} dropped for a failed cell" if block.get("n_dropped") else "") + ")."]
    for name, what in (("recipe", f"the recipe ({block.get('parts_text')})"), ("mechanism", "the mechanism")):
        share = shares.get(name) or {}
        fraction = share.get("fraction")
        of = f", {100 * fraction:.0f}% of the advantage" if fraction is not None else ""
        other = "the gene's mechanism" if name == "recipe" else "the gene's recipe"
        lines.append(f"Share of {what}: {_share_amount(share, block, metric)} ({p(share.get('p_value'))}{of}); "
                     f"its gain alone {_gain(share.get('alone'), block, metric, lower)}, with {other} "
                     f"{_gain(share.get('with'), block, metric, lower)}.")
    inter = block.get("interaction") or {}
    if inter.get("change") is not None:
        units = "log units" if block.get("scale") == "log" else "units"
        span = "" if inter.get("ci_low") is None else f" [{inter['ci_low']:+.4f}, {inter['ci_high']:+.4f}]"
        if inter.get("p_value") is not None and inter["p_value"] < alpha:
            reading = ("the two reinforce each other (each share holds half of their joint gain)" if inter["change"] > 0
                       else "the two overlap: part of what one does, the other does too")
        else:
            reading = "not distinguishable from 0: the two gains add up"
        lines.append(f"Interaction (the mechanism's gain with the gene's recipe minus its gain with the baseline's, "
                     f"{units}): {inter['change']:+.4f}{span} ({p(inter.get('p_value'))}): {reading}.")
    larger = block.get("larger")
    if larger:
        share = shares.get(larger) or {}
        decided = share.get("p_value") is not None and share["p_value"] < alpha
        lines.append(f"The larger share is the {larger}'s" + (
            "." if decided else ", but its own interval reaches 0: more seeds are needed to say it carries the advantage."))
    return lines


def recipe_mechanism_section(result: Mapping, level: str = "##") -> list[str]:
    """The markdown of an ablation's recipe-or-mechanism 2x2 (nothing for a gene without recipe parts)."""
    table = recipe_mechanism_table(result)
    if table is None:
        return []
    block = result["recipe_vs_mechanism"]
    headers, rows, align = table
    cells = block.get("cells") or {}
    lines = [f"{level} Recipe or mechanism", "",
             f"The gene sets its own training recipe ({md_cell(block.get('parts_text'))}) besides its mechanism, so "
             "its advantage over the baseline may come from either. The four crossings were trained on the same "
             f"seeds; mean {result.get('metric_label', 'perplexity')} [{stats.percent(result.get('confidence', 0.95))} "
             "CI]:", "",
             markdown_table(headers, [[md_cell(c) for c in row] for row in rows], align).rstrip(), "",
             "Each share is the mean, seed by seed, of its factor's gain without and with the other (the two orders "
             "of adding them), so the recipe's and the mechanism's shares add up to the whole advantage; a "
             "one-sample t interval each. The interaction test is a paired t-test of the mechanism's per-seed gain "
             "with the gene's recipe against its gain with the baseline's.", ""]
    lines += [f"- {md_cell(t)}" for t in recipe_mechanism_lines(result)] + [""]
    lines += [f"- {md_cell(text.split(' (')[0])}: `{md_cell((cells.get(name) or {}).get('gene'))}`"
              for name, text in RECIPE_CELLS] + [""]
    return lines


def ablation_markdown(result: Mapping) -> str:
    """The text of ``ablation.md``."""
    headers, rows, align = ablation_table(result)
    md_rows = [[md_cell(c) if i != 2 else code(c) for i, c in enumerate(row)] for row in rows]
    seeds = result.get("seeds") or []
    label = result.get("metric_label", "perplexity")
    lines = [
        f"# Ablation of {md_cell(result.get('str'))} (`{md_cell(result.get('gene'))}`)", "",
        f"Each variant was trained with seeds {', '.join(map(str, seeds))} ({seed_note(result)}), "
        f"{result.get('steps')} steps each, on the {result.get('eval_split')} split. "
        f"Δ is mean(variant) − mean(reference) in {label}, with Welch's interval; p-values are Holm-corrected "
        f"within each column." + (f" {GRID_SENTENCE}" if result.get("grid") else ""), "",
        f"Learning-rate schedule: {study_schedule(result)}.", "",
        markdown_table(headers, md_rows, align).rstrip(), "",
        "## Contributions", "",
        f"Positive = the field makes the {label} better.", "",
    ]
    lines += [f"- {md_cell(t)}" for t in contribution_lines(result)] + [""]
    lines += recipe_mechanism_section(result)
    lines += [f"![Contributions]({output_stem('ablation', result.get('eval_split', 'valid'))}.png)", ""]
    lines += grid_section(result, "ablation", names={r["gene"]: r["name"] for r in reversed(result.get("variants", []))})
    return "\n".join(lines)


def compare_markdown(payload: dict) -> str:
    """``compare.md``: the settings, then every configuration ranked by validation loss."""
    s, summary = payload["settings"], payload["summary"]
    aggregates = {a["name"]: a for a in payload["aggregates"]}
    text = any(a.get("bits_per_byte") is not None for a in aggregates.values())  # a text corpus: bits per byte too
    seeds = s["seeds"]
    lines = [
        "# Attention variants at one model size",
        "",
        f"{s['d_model']} dims, {s['n_layers']} layers x {s['n_heads']} heads, FFN {s['d_ff']}, "
        f"{s.get('block', 'gpt2')} block; data {s['data']} "
        f"(vocab {s['vocab_size']}, {s['max_seq_len']} tokens); {s['steps']} steps of batch {s['batch_size']}, "
        + (f"{schedule_text(s.get('config') or s, s.get('steps'))}; " if not s.get("lr_grid") else
           f"lr: each configuration at its own best of {', '.join(f'{r:g}' for r in s['lr_grid'])} "
           f"({schedule_text(s.get('config') or s, s.get('steps')).partition(', ')[2]}; see below); ")
        + f"seed{'s' if seeds > 1 else ''} "
        f"{', '.join(map(str, s['seed_list']))}."
        + (f" Loss is the mean ± sd over {seeds} seeds." if seeds > 1 else ""),
        "",
        "| rank | name | gene | val loss | perplexity | vs baseline | accuracy | params | time (s) | peak MB | status |"
        .replace("| accuracy |", "| accuracy | bits/byte |" if text else "| accuracy |"),
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |" + (" ---: |" if text else ""),
    ]
    paired = summary.get("paired") or {}
    for row in summary["ranking"]:
        a = aggregates[row["name"]]
        loss = number(a["val_loss"], ".4f") + (f" ± {number(a['val_loss_sd'], '.4f')}" if seeds > 1 else "")
        change = "-" if row["perplexity_change_pct"] is None else f"{row['perplexity_change_pct']:+.1f}%"
        if row["name"] in paired:  # several seeds: the paired change with its interval and verdict
            change = f"{change_text(paired[row['name']], 'val_perplexity')}: {verdict_cell(paired[row['name']])}"
        lines.append(f"| {row['rank']} | {md_cell(a['name'])} | `{md_cell(a['gene'])}` | {loss} | {number(a['val_perplexity'], '.2f')} | "
                     f"{change} | {number(a['accuracy'], '.4f')} | "
                     + (f"{number(a.get('bits_per_byte'), '.4f')} | " if text else "") + f"{number(a['params'], ',.0f')} | "
                     f"{number(a['time_s'], '.1f')} | {number(a['peak_memory_mb'], '.0f')} | {a['status']} |")
    for failed in summary["failed"]:
        a = aggregates[failed["name"]]
        why = "; ".join(failed["errors"]) or failed["status"]
        lines.append(f"| - | {md_cell(a['name'])} | `{md_cell(a['gene'])}` | - | - | - | - | {'- | ' if text else ''}"
                     f"{number(a['params'], ',.0f')} | "
                     f"{number(a['time_s'], '.1f')} | {number(a['peak_memory_mb'], '.0f')} | "
                     f"{a['status']}: {md_cell(why)} |")
    if paired:
        family = max((p.get("family_size") or 0 for p in paired.values()), default=0)
        lines += ["", f"vs baseline: the change of perplexity paired by seed (a paired t-test on the per-seed log "
                  f"perplexities, its 95% interval), with the verdict (Holm over {family} comparisons; equivalence "
                  f"within ±{100 * (s.get('margin') or stats.DEFAULT_MARGIN):g}%; see docs/validation.md)."]
    lines += ["", f"Validation loss across the {summary['n_ok']} configurations that trained: "
              f"{number(summary['val_loss_mean'], '.4f')} ± {number(summary['val_loss_sd'], '.4f')} (mean ± sd)."
              + ("" if summary.get("total_time_s") is None else f" Total time {summary['total_time_s']:.0f} s."),
              "", f"![comparison]({COMPARE_FIGURE})", ""]
    if payload.get("grid"):
        names = {c["gene"]: c["name"] for c in reversed(s.get("configs") or [])}
        lines += grid_section({**payload, "eval_split": "valid"}, "compare", names=names)
    return "\n".join(lines)


# -- difficulty curves -----------------------------------------------------------------------------
BREAK_MARK = "↓"  # marks the cell of the value where a gene breaks


def knob_value(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def curve_cell(row: Mapping, breaks: bool = False) -> str:
    """A gene at one value: mean accuracy ± the half-width of its interval, the seeds that finished
    when some did not, ``BREAK_MARK`` where the gene breaks."""
    if row.get("mean") is None:
        return "failed" if row.get("n_failed") else "-"
    text = f"{row['mean']:.3f}" + (f" ± {row['half_width']:.3f}" if row.get("half_width") is not None else "")
    if row.get("n_failed"):
        text += f" ({row.get('n_ok')}/{row.get('n_ok', 0) + row['n_failed']})"
    return f"{BREAK_MARK} {text}" if breaks else text


def breaks_text(gene: Mapping, knob: str) -> str:
    if gene.get("breaks_at") is not None:
        return f"{knob}={knob_value(gene['breaks_at'])}"
    return "holds" if gene.get("holds") else "-"


def curve_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of a curve: a row per gene (the gene key in column 1), a column per
    value of the knob, where it breaks; the last row is the chance accuracy."""
    knob, values = result.get("knob", "knob"), result.get("values") or []
    headers = (["Configuration", "Gene"] + [f"{knob}={knob_value(v)}" for v in values]
               + [f"Breaks at (mean < {result.get('break_at', 0.5):g})"])
    rows = []
    for gene in result.get("genes") or []:
        cells = [curve_cell(row, gene.get("breaks_at") is not None and row.get("value") == gene["breaks_at"])
                 for row in gene.get("points") or []]
        rows.append([str(gene.get("name", "")), str(gene.get("gene", ""))] + cells + [breaks_text(gene, knob)])
    rows.append(["chance", None] + [number(p.get("chance_accuracy"), ".3f") for p in result.get("points") or []]
                + [""])
    return headers, rows, "ll" + "r" * len(values) + "l"


def curve_note(result: Mapping) -> str:
    """What a curve's cells and breakpoints mean."""
    seeds = result.get("seeds") or []
    conf = stats.percent(result.get("confidence", 0.95))
    spread = (f"the mean over {len(seeds)} seeds ± the half-width of its {conf} t interval"
              if len(seeds) > 1 else "one seed (no interval)")
    return (f"Each cell: validation accuracy (the fraction of answers right), {spread}; (k/n) when only k of n seeds "
            f"finished. A gene breaks at the first value, in the order given, where its mean accuracy falls below "
            f"{result.get('break_at', 0.5):g} ({BREAK_MARK} marks that cell); it holds when its mean stays at or "
            "above it at every value. The last row is chance accuracy.")


def curve_markdown(result: Mapping) -> str:
    """``curve.md``: what was swept and trained, then the table and the figure."""
    m = result.get("model") or {}
    knob, seeds = result.get("knob"), result.get("seeds") or []
    values = ", ".join(knob_value(v) for v in result.get("values") or [])
    lines = [
        f"# Difficulty curve: accuracy against {knob} ({result.get('task')})", "",
        f"Data `{md_cell(result.get('base_data'))}` with {knob} = {values}; {m.get('d_model')}d x "
        f"{m.get('n_layers')} layers x {m.get('n_heads')} heads (FFN {m.get('d_ff')}), {m.get('block', 'gpt2')} "
        f"block; {result.get('steps')} steps of batch {m.get('batch_size')}, lr {number(m.get('learning_rate'), 'g')} "
        f"({m.get('lr_schedule')}); seed{'s' if len(seeds) != 1 else ''} {', '.join(map(str, seeds))}.", "",
        curve_note(result), "",
    ]
    if result.get("interrupted"):
        lines += ["**Interrupted**: the cells without a result did not finish; run the same command again to "
                  "resume.", ""]
    lines += [curve_table_markdown(result).rstrip(), "", f"![accuracy against {knob}]({CURVE_FIGURE})", ""]
    return "\n".join(lines)


def curve_table_markdown(result: Mapping) -> str:
    """A curve's table as ``curve.md`` (and the docs) show it."""
    headers, rows, align = curve_table(result)
    cells = [[md_cell(c) if i != 1 else code(c) for i, c in enumerate(row)] for row in rows]
    return markdown_table(headers, cells, align).rstrip() + "\n"


# -- genes on a suite of tasks (compare --suite, validate --suite) -----------------------------------
def suite_cell(mean, sd=None, failed: int = 0, digits: int = 3) -> str:
    """A suite table's cell: ``0.512 ± 0.020`` (the sd only with several seeds), ``(1 failed)``."""
    text = fmt(mean, digits) + ("" if sd is None else f" ± {fmt(sd, digits)}")
    return text + (f" ({failed} failed)" if failed else "")


def suite_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of a suite study: per gene (the baseline first) its accuracy on every
    point and its suite accuracy (mean ± sd over the seeds; a failed training counts 0), the
    interval, and against the baseline the paired change with its interval, Holm's p and the verdict."""
    labels = [p["label"] for p in result["suite"]["points"]]
    conf = stats.percent(result.get("confidence", 0.95))
    headers = ["Name", "Gene"] + labels + ["Suite accuracy", f"{conf} CI", f"Paired change [{conf} CI]",
                                           f"p (Holm, {result.get('family_size') or 0})", "Verdict"]
    rows = []
    for r in [result["baseline"]] + list(result.get("genes", [])):
        cells = [str(r.get("name", "")), str(r.get("gene", ""))]
        cells += [suite_cell(c.get("mean"), c.get("sd"), c.get("n_failed", 0))
                  for c in (r["points"][label] for label in labels)]
        cells += [suite_cell(r.get("mean"), r.get("sd"), digits=4), interval(r.get("ci_low"), r.get("ci_high"), 4)]
        if r is result["baseline"]:
            cells += ["-", "-", "baseline (reference)"]
        elif r.get("verdict") is None:
            cells += ["-", "-", "one seed: no comparison"]
        else:
            cells += [change_text(r, "suite_accuracy"), p_text(r.get("p_holm")), verdict_cell(r)]
        rows.append(cells)
    return headers, rows, "ll" + "r" * (len(labels) + 4) + "l"


def suite_points_lines(suite: Mapping) -> list[str]:
    """The points of a suite as markdown bullets: label, data and steps."""
    return [f"- `{md_cell(p['label'])}`: `{md_cell(p['data'])}`, {p.get('steps')} steps" for p in suite["points"]]


def suite_markdown(result: Mapping, figure: str | None = None) -> str:
    """The text of ``compare_suite.md`` / ``validation_suite.md``."""
    headers, rows, align = suite_table(result)
    md_rows = [[code(c) if i == 1 else md_cell(c) for i, c in enumerate(row)] for row in rows]
    suite, seeds = result["suite"], result.get("seeds") or []
    title = "Genes compared on a suite" if result.get("study") == "compare" else "Multi-seed validation on a suite"
    lines = [f"# {title}: {md_cell(suite['name'])}", "", result.get("headline", ""), "",
             f"Every gene and the vanilla baseline were trained on every point of suite {md_cell(suite['name'])} "
             f"({md_cell(suite.get('source') or '')}) with seed{'s' if len(seeds) != 1 else ''} "
             f"{', '.join(map(str, seeds))}, and measured by accuracy over the answer positions on the "
             f"{result.get('eval_split')} split. A gene's suite accuracy is the mean accuracy over the points on one "
             "seed, a failed training counting 0 on its point; the cells are the mean ± sd over the seeds of the "
             "same accuracies. " + (comparison_note(result) if result.get("family_size") else
                               "With one seed there is no paired comparison."), "",
             markdown_table(headers, md_rows, align).rstrip(), "", "The points:", ""] + suite_points_lines(suite) + [""]
    failures = [(r.get("name"), f) for r in [result["baseline"]] + list(result.get("genes", []))
                for f in r.get("failures", [])]
    if failures:
        lines += ["Failed trainings (each scores 0 accuracy on its point):", ""]
        lines += [f"- {md_cell(n)}, point `{md_cell(f['point'])}`, seed {f['seed']}: {f['status']}"
                  + (f" ({md_cell(f['error'])})" if f.get("error") else "") for n, f in failures] + [""]
    if figure:
        lines += [f"![Accuracy per gene and point]({figure})", ""]
    return "\n".join(lines)


def suite_heatmap_rows(result: Mapping) -> tuple[list[str], list[dict]]:
    """The heat map of a suite study: columns (the points, then 'suite'), and per gene (the baseline
    first) its name, mean and sd per column and failures per column."""
    labels = [p["label"] for p in result["suite"]["points"]]
    rows = []
    for r in [result["baseline"]] + list(result.get("genes", [])):
        cells = [r["points"][label] for label in labels]
        rows.append({"name": str(r.get("name") or r.get("str")),
                     "means": [c.get("mean") for c in cells] + [r.get("mean")],
                     "sds": [c.get("sd") for c in cells] + [r.get("sd")],
                     "failed": [c.get("n_failed", 0) for c in cells] + [0]})
    return labels + ["suite"], rows


# -- transfer across scale ------------------------------------------------------------------------
def share(value, signed: bool = True) -> str:
    """A fraction as a percentage: 0.031 -> '+3.1%' ('-' when missing)."""
    return "-" if value is None else f"{100 * value:{'+' if signed else ''}.1f}%"


def share_interval(low, high) -> str:
    return "-" if low is None or high is None else f"[{share(low)}, {share(high)}]"


def advantage_text(row: Mapping) -> str:
    """A gene's advantage with its interval: '+3.1% [+1.0%, +5.2%]'."""
    return f"{share(row.get('advantage'))} {share_interval(row.get('advantage_low'), row.get('advantage_high'))}"


def _transfer_best(result: Mapping) -> dict | None:
    """The gene with the largest advantage at the reference size (None if none has one)."""
    sizes = result.get("sizes") or []
    rows = [r for r in (sizes[0].get("genes", []) if sizes else []) if r.get("advantage") is not None]
    return max(rows, key=lambda r: (r["advantage"], r["gene"])) if rows else None


def transfer_headline(result: Mapping) -> str:
    """One sentence: the gene best at the reference size, carried to the largest size, and its verdict."""
    sizes = result.get("sizes") or []
    best = _transfer_best(result)
    if len(sizes) < 2 or best is None:
        return "No gene finished enough trainings at the reference size to compare it across sizes."
    top = next((s for s in sizes if s.get("size") == result.get("largest")), sizes[-1])
    at_top = next((g for g in top.get("genes", []) if g.get("gene") == best["gene"]), {})
    conf = stats.percent(result.get("confidence", 0.95))
    verdict = at_top.get("transfer", stats.TOO_FEW)
    said = {stats.HOLDS: "holds", stats.SHRINKS: "shrinks", stats.VANISHES: "vanishes", stats.REVERSES: "reverses"}
    what = (f"its advantage over the baseline **{said[verdict]}**" if verdict in said
            else f"**{verdict}**")
    tau = top.get("kendall_tau")
    return (f"{best['str']} from {sizes[0]['size']} to {top['size']} ({fmt(top.get('params'))} parameters): {what} "
            f"(advantage {advantage_text(best)} -> {advantage_text(at_top)}, {conf} intervals); "
            f"Kendall's tau between the rankings of the {fmt(top.get('kendall_n'))} (genes and baseline) at the two "
            f"sizes {fmt(tau, 2)}.")


def transfer_sizes_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of the ladder: shape, budget, the baseline's parameters, Kendall's tau."""
    ref = result.get("reference", "")
    headers = ["Size", "Heads", "FFN", "Steps", "Tokens", "Params (baseline)", f"Kendall's tau vs {ref}", "p", "n"]
    rows = []
    for s in result.get("sizes", []):
        label = str(s.get("size")) + (" (reference)" if s.get("reference") else "")
        rows.append([label, fmt(s.get("n_heads")), fmt(s.get("d_ff")), fmt(s.get("steps")), fmt(s.get("tokens")),
                     fmt(s.get("params")), "reference" if s.get("reference") else fmt(s.get("kendall_tau"), 2),
                     "-" if s.get("reference") else p_text(s.get("kendall_p")), fmt(s.get("kendall_n"))])
    return headers, rows, "lrrrrrrrr"


def transfer_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of every gene at every size (the baseline first at each); the gene key
    is column 1."""
    d = digits_for(result.get("metric", ""))
    conf = stats.percent(result.get("confidence", 0.95))
    grid = bool(result.get("grid"))
    headers = ["Size", "Gene", "Seeds ok"] + (["lr"] if grid else []) + [
        f"Mean [{conf} CI]", f"Paired change [{conf} CI]", "p (Holm)", "Verdict",
        "Advantage change vs reference (p Holm)", "Params", "Transfer"]
    rows = []
    for s in result.get("sizes", []):
        rates = grid_rates(result, s.get("size"))
        for r in [s.get("baseline") or {}] + list(s.get("genes", [])):
            n = len(r.get("values") or [])
            cells = [str(s.get("size")), str(r.get("gene", "")), f"{n - (r.get('n_failed') or 0)}/{n}"]
            cells += [rate_cell(rates.get(r.get("gene")))] if grid else []
            cells += [f"{fmt(r.get('mean'), d)} {interval(r.get('ci_low'), r.get('ci_high'), d)}"]
            if r is s.get("baseline"):
                cells += ["-", "-", "-", "-", fmt(r.get("params")), "baseline"]
            else:
                cells += [change_text(r, result.get("metric", "")), p_text(r.get("p_holm")), verdict_cell(r),
                          interaction_text(r.get("interaction")), fmt(r.get("params")), str(r.get("transfer", ""))]
            rows.append(cells)
    return headers, rows, "llr" + ("r" if grid else "") + "rrrlrrl"


def interaction_text(inter: Mapping | None) -> str:
    """The change of a gene's paired (log) advantage from the reference size, with its interval
    and Holm p ('-' at the reference size)."""
    if not inter or inter.get("change") is None:
        return "-"
    span = "" if inter.get("ci_low") is None else f" [{inter['ci_low']:+.4f}, {inter['ci_high']:+.4f}]"
    return f"{inter['change']:+.4f}{span} (p {p_text(inter.get('p_holm'))})"


def transfer_note(result: Mapping) -> str:
    """How the numbers were made, in one paragraph."""
    seeds = result.get("seeds") or []
    conf = stats.percent(result.get("confidence", 0.95))
    budget = (f"{result['tokens_per_param']:g} training tokens per baseline parameter at each size"
              if result.get("tokens_per_param") else "the steps listed per size")
    return (f"Every gene and the vanilla baseline were trained {len(seeds)} times at each size, with seeds "
            f"{', '.join(map(str, seeds))} ({seed_note(result)}), in the {result.get('block', 'gpt2')} block, for "
            f"{budget}, and measured on the {result.get('eval_split')} split. The reference is "
            f"{result.get('reference')}, the {'search' if result.get('source_run') else 'configured'} size. Means have "
            f"{conf} t intervals. Each gene is compared with the baseline seed by seed at each size (a paired t-test "
            f"on the per-seed log differences; the change is relative, so it reads the same at every size); p "
            f"(Holm) is corrected over every comparison of the ladder and those the store holds against the same "
            f"baseline trainings, and decides the verdict (better, worse, equivalent within the margin, or "
            f"undetermined). The interaction test asks whether the advantage changes from the reference size: a "
            f"paired t-test of the per-seed differences of log differences (Holm over genes and sizes). The transfer "
            f"word reads the advantage's interval at each size against the reference (the rule below). Kendall's tau "
            f"compares the ranking of the genes and the baseline by their means with the reference size's, when at "
            f"least 4 are ranked.")


def transfer_schedule_lines(result: Mapping) -> list[str]:
    """``SIZE: schedule`` per size of a ladder (a warm-up fraction resolves to each size's steps)."""
    grid = (result.get("grid") or {}).get("rates") or ()
    genes = [str(g.get("gene")) for g in result.get("genes") or []]
    return [f"{s.get('size')}: {schedule_text(result.get('config'), s.get('steps'), grid=grid, genes=genes)}"
            for s in result.get("sizes") or []]


def transfer_rule_lines() -> list[str]:
    """The verdict rule, one line per verdict, in the order it is applied."""
    return [f"**{verdict}**: {text}" for verdict, text in stats.TRANSFER_RULE]


def transfer_markdown(result: Mapping) -> str:
    """The text of ``transfer.md``."""
    headers, rows, align = transfer_sizes_table(result)
    genes_headers, gene_rows, genes_align = transfer_table(result)
    gene_md = [[code(c) if i == 1 else md_cell(c) for i, c in enumerate(row)] for row in gene_rows]
    lines = [
        "# Transfer across scale", "",
        result.get("headline", ""), "",
        transfer_note(result) + (f" {GRID_SENTENCE} The grid is tuned at every size." if result.get("grid") else ""),
        "",
        markdown_table(headers, [[md_cell(c) for c in row] for row in rows], align).rstrip(), "",
        "Learning-rate schedule at each size:", "",
        *[f"- {md_cell(line)}" for line in transfer_schedule_lines(result)], "",
        markdown_table(genes_headers, gene_md, genes_align).rstrip(), "",
        "Verdicts (the first rule that applies, at each size against the reference):", "",
    ]
    lines += [f"- {line}" for line in transfer_rule_lines()] + [""]
    failures = [(s.get("size"), r.get("gene"), e) for s in result.get("sizes", [])
                for r in [s.get("baseline") or {}] + list(s.get("genes", [])) for e in r.get("errors", [])]
    if failures:
        lines += ["Failed trainings (left out of the statistics):", ""]
        lines += [f"- {size} `{g}`: {md_cell(e)}" for size, g, e in failures] + [""]
    lines += [f"![{result.get('metric_label', 'perplexity')} against parameters]"
              f"({output_stem('transfer', result.get('eval_split', 'valid'))}.png)", ""]
    lines += grid_section(result, "transfer")
    return "\n".join(lines)


# -- learning-rate grids --------------------------------------------------------------------------
GRID_SENTENCE = ("Each gene and the baseline were trained at their own learning rate, the best of a grid on tuning "
                 "seeds of their own (see \"Each gene at its own best learning rate\" below).")
WIDEN = "the grid should be widened"


def grid_figure_name(kind: str, eval_split: str = "valid") -> str:
    """The figure of a study's learning-rate grid: ``validation_lr_grid.png`` (``KIND[_test]_lr_grid.png``)."""
    return f"{output_stem(kind, eval_split)}_lr_grid.png"


def rate_cell(rate) -> str:
    return "-" if rate is None else f"{rate:g}"


def grid_rates(result: Mapping, size: str | None = None) -> dict:
    """Gene key -> the rate it was measured at, from a result's ``grid`` block (at ``size`` for a
    ladder's); empty without a grid."""
    grid = result.get("grid") or {}
    if "sizes" in grid:
        grid = next((s for s in grid["sizes"] if s.get("size") == size), {})
    return {key: row.get("selected") for key, row in (grid.get("genes") or {}).items()}


def edge_warnings(genes: Mapping[str, Mapping], rates, names: Mapping[str, str] | None = None,
                  where: str = "") -> list[str]:
    """A sentence per gene whose selected rate is an end of the grid: the grid should be widened."""
    names = names or {}
    out = []
    for key, row in genes.items():
        if not row.get("at_edge"):
            continue
        end = "smallest" if row.get("selected") == min(rates) else "largest"
        name = names.get(key) or ("the baseline" if row.get("baseline") else None)  # a name, else the key alone
        who = f"{name} (`{key}`)" if name else f"`{key}`"
        out.append(f"the best rate of {who}{where} is the grid's {end}, {rate_cell(row.get('selected'))}: "
                   f"{WIDEN}")
    return out


def _grid_order(genes: Mapping[str, Mapping]) -> list[tuple[str, Mapping]]:
    return sorted(genes.items(), key=lambda item: not item[1].get("baseline"))  # the baseline first


def _grid_label(key: str, row: Mapping, names: Mapping[str, str] | None) -> str:
    return (names or {}).get(key) or ("baseline" if row.get("baseline") else "")


def grid_table(genes: Mapping[str, Mapping], rates, metric: str,
               names: Mapping[str, str] | None = None) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of a grid: per gene (the baseline first) its mean at every rate
    (with the failed tuning seeds), the selected rate and whether it is an end of the grid."""
    d = digits_for(metric)
    headers = ["Gene"] + [f"lr {r:g}" for r in rates] + ["Selected", "At an edge"]
    rows = []
    for key, row in _grid_order(genes):
        label = _grid_label(key, row, names)
        cells = [f"{label}: {key}" if label else key]
        for point in row.get("curve") or []:
            failed = point.get("n_failed") or 0
            cells.append(fmt(point.get("mean"), d) + (f" ({failed} failed)" if failed else ""))
        cells += [rate_cell(row.get("selected")), "yes" if row.get("at_edge") else "no"]
        rows.append(cells)
    return headers, rows, "l" + "r" * (len(rates) + 1) + "l"


def grid_section(result: Mapping, kind: str, names: Mapping[str, str] | None = None) -> list[str]:
    """The markdown of a result's learning-rate grid (nothing without one): how the rates were
    chosen, each gene's curve and rate (per size for a ladder), a warning per edge winner, and the
    figure."""
    grid = result.get("grid")
    if not grid:
        return []
    rates, tuning, verdict = grid.get("rates") or [], grid.get("tuning_seeds") or [], grid.get("verdict_seeds") or []
    label = grid.get("metric_label", result.get("metric_label", "perplexity"))
    split = result.get("eval_split", "valid")
    measured = "the validation split" if split == "valid" else f"the {split} split"
    lines = [
        "## Each gene at its own best learning rate", "",
        f"Every gene, the baseline included, was trained at each rate of the grid "
        f"{', '.join(f'{r:g}' for r in rates)} with the tuning seeds {', '.join(map(str, tuning))} and measured on "
        f"the validation split. Its rate is the one with the best mean {label} over the tuning seeds, among the "
        f"rates at which every tuning seed finished (ties: the smaller rate). The comparisons above are measured at the selected rates with the seeds "
        f"{', '.join(map(str, verdict))}, disjoint from the tuning seeds, on {measured}; each gene is paired by "
        f"seed with the baseline at the baseline's own rate.", "",
    ]
    blocks = [(str(s["size"]), s["genes"]) for s in grid["sizes"]] if "sizes" in grid else [(None, grid["genes"])]
    warnings = []
    for size, genes in blocks:
        headers, rows, align = grid_table(genes, rates, grid.get("metric", ""), names)
        if size is not None:
            lines += [f"### {size}", ""]
        firsts = [(f"{md_cell(_grid_label(k, g, names))}: " if _grid_label(k, g, names) else "") + code(k)
                  for k, g in _grid_order(genes)]
        md_rows = [[first] + [md_cell(c) for c in row[1:]] for first, row in zip(firsts, rows)]
        lines += [markdown_table(headers, md_rows, align).rstrip(), ""]
        warnings += edge_warnings(genes, rates, names, "" if size is None else f" at {size}")
    lines += [f"- **Warning:** {w}." for w in warnings] + ([""] if warnings else [])  # not in a table: pipes stay
    lines += [f"![Learning-rate grid]({grid_figure_name(kind, split)})", ""]
    return lines
