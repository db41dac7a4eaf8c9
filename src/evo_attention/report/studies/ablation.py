"""An ablation: reads an ablation result (``variants`` with their comparisons ``vs_full`` and ``vs_baseline``,
``total`` and ``contributions``, and for a gene that sets its own recipe the ``recipe_vs_mechanism`` 2x2) and
renders the variants table, the contribution sentences, the recipe-or-mechanism section and ``ablation.md``.

A contribution is the signed change of the metric a field causes, with the field minus without it
(``field_changes``; the sign convention of ``util.format``, the direction said with it): removing F reads as
the full gene against the gene without F, adding F as the baseline with F against the baseline, ``total`` as
the whole gene against the baseline. The recipe-or-mechanism block has the same sign (``recipe_changes``):
each share and the interaction is a change of the metric, never a gain. ``current_ablation`` reads a result
written with the older sign (positive = better) in this one.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from evo_attention.report.attachments import output_stem
from evo_attention.report.studies.common import (change_text, ci_text, digits_for, lower_is_better, p_text,
                                                 partial_note, seed_note, study_schedule, table_markdown)
from evo_attention.report.studies.lr_grid import GRID_SENTENCE, grid_rate_cell, grid_rates, grid_section
from evo_attention.util import stats
from evo_attention.util.format import change_header, code, direction, fmt, md_cell


# gene field -> how an ablation names it
FIELD_LABELS = {"similarity": "similarity", "normalization": "normalization", "gating": "gating",
                "temperature_mode": "temperature", "use_bias": "bias", "attention_dropout": "attention dropout",
                "learning_rate": "learning rate", "warmup": "warm-up", "weight_decay": "weight decay"}


def ablation_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of the ablation table in plain text."""
    d = digits_for(result.get("metric", ""))
    conf = stats.percent(result.get("confidence", 0.95))
    rates = grid_rates(result)
    headers = ["Variant", "What changed", "Key", "Seeds ok"] + (["lr"] if rates else []) + [
        f"Mean [{conf} CI]", change_header("Δ vs full gene", lower_is_better(result.get("metric", ""))), "p (Holm)",
        "Δ vs baseline", "p (Holm)"]
    rows = []
    for r in result.get("variants", []):
        n = len(r.get("values") or [])
        crossed = r.get("kind") in ("mechanism", "recipe")  # a cell of the recipe-or-mechanism 2x2
        change = str(r.get("change")).split(": ", 1)[-1] if r.get("field") or crossed else "-"
        cells = [str(r.get("name")), change, str(r.get("gene")), f"{n - (r.get('n_failed') or 0)}/{n}"]
        cells += [grid_rate_cell(rates.get(r.get("gene")))] if rates else []
        cells += [f"{fmt(r.get('mean'), d)} {ci_text(r.get('ci_low'), r.get('ci_high'), d)}"]
        for key in ("vs_full", "vs_baseline"):
            c = r.get(key)
            if not c or c.get("difference") is None:
                cells += ["-", "-"]
            else:
                cells += [change_text(c, result.get("metric", "")), p_text(c.get("p_holm"))]
        rows.append(cells)
    return headers, rows, "lllr" + ("r" if rates else "") + "rrrrr"


# the older contributions' sign (``value``/``low``/``high``: positive = better), named in ``recomputed_from``
OLDER_SIGN = "contributions, positive = better"


def _inverse(comparison: Mapping) -> dict:
    """A paired comparison of A against B as B against A: the difference negated, a relative change r as
    1 / (1 + r) - 1 (the ratio inverted), intervals swapped."""
    def flip(x):
        if x is None:
            return None
        return 1.0 / (1.0 + x) - 1.0 if comparison.get("scale") == "log" else -x
    out = dict(comparison)
    for value, low, high in (("difference", "diff_ci_low", "diff_ci_high"),
                             ("relative", "relative_ci_low", "relative_ci_high")):
        out[value], out[low], out[high] = flip(comparison.get(value)), flip(comparison.get(high)), \
            flip(comparison.get(low))
    if comparison.get("scale") != "log":  # a plain difference: negating it is its whole inverse
        out["relative"] = out["relative_ci_low"] = out["relative_ci_high"] = None
    return out


def _field_change(row: Mapping, comparison: Mapping | None, kind: str) -> dict:
    """One contribution: the comparison's change (relative on a ratio metric's log scale, else the difference)
    with its interval and p."""
    c = comparison or {}
    relative = c.get("scale") == "log"
    names = ("relative", "relative_ci_low", "relative_ci_high") if relative else \
        ("difference", "diff_ci_low", "diff_ci_high")
    value, low, high = (c.get(n) for n in names)
    if low is None or high is None:
        low = high = None
    return {"name": row.get("name"), "field": row.get("field"), "kind": kind, "change": row.get("change"),
            "relative": relative, "metric_change": value, "metric_change_low": low, "metric_change_high": high,
            "p_holm": c.get("p_holm")}


def field_changes(variants: Sequence[Mapping]) -> tuple[list[dict], dict | None]:
    """(contributions, total) from an ablation's variants (the full gene first): per removed field the inverse
    of its ``vs_full``, per added field its ``vs_baseline``, and the whole gene's ``vs_baseline``."""
    contributions = []
    for row in variants:
        if row.get("kind") == "remove":
            contributions.append(_field_change(row, _inverse(row["vs_full"]) if row.get("vs_full") else None,
                                               "remove"))
        elif row.get("kind") == "add":
            contributions.append(_field_change(row, row.get("vs_baseline"), "add"))
    total = _field_change(variants[0], variants[0].get("vs_baseline"), "total") if variants else None
    return contributions, total


def current_ablation(result: Mapping) -> dict:
    """``result`` in the current sign: older contributions (``value``, positive = better) are recomputed from
    the variants' comparisons, the older convention named in ``recomputed_from``; an older
    ``recipe_vs_mechanism`` block (gains) is converted by ``recipe_changes``, marked in its own
    ``recomputed_from``."""
    out = dict(result)
    older = [c for c in list(result.get("contributions") or []) + [result.get("total") or {}]
             if "value" in c and "metric_change" not in c]
    if older:
        contributions, total = field_changes(result.get("variants") or [])
        out.update(contributions=contributions, total=total, recomputed_from=OLDER_SIGN)
    block = result.get("recipe_vs_mechanism")
    total = ((block or {}).get("shares") or {}).get("total") or {}
    if "mean" in total and "metric_change" not in total:  # the gains of two_factor_shares
        shares, interaction = recipe_changes(block["shares"], block.get("interaction") or {}, block.get("scale"),
                                             lower=result.get("lower_is_better", True))
        out["recipe_vs_mechanism"] = {**block, "shares": shares, "interaction": interaction,
                                      "recomputed_from": OLDER_RECIPE_SIGN}
    return out


def contribution_sign(result: Mapping) -> str:
    """What a contribution's sign means, in one sentence with the metric's direction."""
    label = result.get("metric_label", "perplexity")
    return (f"Each contribution is the change of {label} the field causes, with the field minus without it "
            f"({direction(lower_is_better(result.get('metric', 'val_perplexity')))}).")


def contribution_lines(result: Mapping) -> list[str]:
    """Plain sentences: the whole gene's change (with the metric's direction), then each field's, the most
    helpful first."""
    metric, label = result.get("metric", ""), result.get("metric_label", "perplexity")
    lower = lower_is_better(result.get("metric", "val_perplexity"))
    lines, conf = [], result.get("confidence", 0.95)
    total = result.get("total") or {}
    if total.get("metric_change") is not None:
        lines.append(f"Whole gene vs baseline: {label} change {_change_text(total, metric)} ({direction(lower)}; "
                     f"{_contribution_significance(total, conf)}).")
    for kind, text in (("remove", "in the gene (the gene minus the gene without it)"),
                       ("add", "alone on the baseline (the baseline with it minus the baseline)")):
        items = [c for c in result.get("contributions", []) if c["kind"] == kind and c.get("metric_change") is not None]
        for c in sorted(items, key=lambda c: c["metric_change"] if lower else -c["metric_change"]):
            lines.append(f"{c['change']}: {text} {_change_text(c, metric)} "
                         f"({_contribution_significance(c, conf)}).")
    if lines and total.get("metric_change") is None:  # no whole-gene line to say the direction: say it first
        lines.insert(0, contribution_sign(result))
    if result.get("recomputed_from"):
        lines.append(f"These contributions were recomputed from the variants' stored comparisons of a result "
                     f"written with the older sign ({result['recomputed_from']}).")
    return lines


def _contribution_significance(c: Mapping, confidence: float) -> str:
    low, high = c.get("metric_change_low"), c.get("metric_change_high")
    if c.get("p_holm") is not None and c["p_holm"] < 1.0 - float(confidence):
        return f"significant at {stats.percent(confidence)} after Holm's correction"
    if low is not None and (low > 0 or high < 0):
        return "its own interval excludes 0, but not significant after Holm's correction"
    return "not distinguishable from 0"


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
        return f"{fmt(c.get('mean'), d)} {ci_text(c.get('ci_low'), c.get('ci_high'), d)}"

    headers = ["Mechanism (rows), recipe (columns)", "the baseline's recipe",
               f"the gene's recipe ({block.get('parts_text')})"]
    rows = [["the baseline's mechanism", cell("neither"), cell("recipe")],
            ["the gene's mechanism", cell("mechanism"), cell("both")]]
    return headers, rows, "lrr"


# the older recipe_vs_mechanism's sign (``stats.two_factor_shares``' gains), named in its ``recomputed_from``
OLDER_RECIPE_SIGN = "recipe_vs_mechanism gains, positive = better"


def _as_change(value, low, high, lower: bool) -> tuple:
    """A gain of ``stats.two_factor_shares`` (positive = better) as a signed change of the metric: negated, its
    interval swapped, when lower is better."""
    if not lower:
        return value, low, high
    return tuple(None if x is None else -x for x in (value, high, low))


def recipe_changes(shares: Mapping[str, Mapping], interaction: Mapping, scale: str | None, *,
                   lower: bool) -> tuple[dict, dict]:
    """(shares, interaction) of ``stats.two_factor_shares`` (gains of ``total``, ``mechanism``, ``recipe``) in the
    one sign convention, as ``recipe_vs_mechanism`` stores them. A share: ``change`` [``change_low``,
    ``change_high``] on the analysis scale (log units on the log scale, where the two factors add up to the
    total exactly), ``metric_change`` [``_low``, ``_high``] as contributions show it (``relative``: on the log
    scale exp(change) - 1, else the metric's units), ``p_value``, ``fraction`` (of the whole change), and for the
    factors ``alone`` and ``with`` (without and with the other, analysis scale). The interaction:
    ``paired_interaction``'s fields, ``change`` [``ci_low``, ``ci_high``] and ``t`` the mechanism's change with
    the gene's recipe minus with the baseline's (negative, lower being better: the two reinforce each other)."""
    log = scale == "log"

    def metric(x):
        return None if x is None else (math.expm1(x) if log else x)

    out = {}
    for name, gain in shares.items():
        change, low, high = _as_change(gain.get("mean"), gain.get("ci_low"), gain.get("ci_high"), lower)
        out[name] = {"change": change, "change_low": low, "change_high": high, "relative": log,
                     "metric_change": metric(change), "metric_change_low": metric(low),
                     "metric_change_high": metric(high), "p_value": gain.get("p_value"), "fraction": gain.get("fraction")}
        for key in ("alone", "with"):
            if key in gain:
                out[name][key] = _as_change(gain[key], None, None, lower)[0]
    inter = dict(interaction)
    if inter:
        inter["change"], inter["ci_low"], inter["ci_high"] = _as_change(inter.get("change"), inter.get("ci_low"),
                                                                        inter.get("ci_high"), lower)
        inter["t"] = _as_change(inter.get("t"), None, None, lower)[0]
    return out, inter


def _change_text(share: Mapping, metric: str) -> str:
    """A contribution's or share's change with its interval: in % on the log scale, else in the metric's units."""
    value, low, high = share.get("metric_change"), share.get("metric_change_low"), share.get("metric_change_high")
    if value is None:
        return "-"
    if share.get("relative"):
        span = "" if low is None or high is None else f" [{100 * low:+.2f}%, {100 * high:+.2f}%]"
        return f"{100 * value:+.2f}%{span}"
    d = digits_for(metric)
    return f"{value:+.{d}f} {ci_text(low, high, d)}"


def _recipe_change_text(change, block: Mapping, metric: str) -> str:
    """A change on the analysis scale (log units on the log scale) as the signed change of the metric."""
    if change is None:
        return "-"
    if block.get("scale") == "log":
        return f"{100 * math.expm1(change):+.2f}%"
    return f"{change:+.{digits_for(metric)}f}"


def recipe_mechanism_lines(result: Mapping) -> list[str]:
    """Plain sentences, every number a signed change of the metric (the direction said in the first): the whole
    change, the recipe's and the mechanism's shares (alone and with the other), the interaction, the larger."""
    result = current_ablation(result)  # an older block (gains) in the current sign
    block = result.get("recipe_vs_mechanism")
    if not block:
        return []
    metric, lower = result.get("metric", ""), result.get("lower_is_better", True)
    alpha = 1.0 - float(result.get("confidence", 0.95))
    shares, label = block.get("shares") or {}, result.get("metric_label", "perplexity")

    def p(value) -> str:
        return "p -" if value is None else f"p {p_text(value)}"

    total = shares.get("total") or {}
    lines = [f"Whole gene vs baseline: {label} change {_change_text(total, metric)} "
             f"({direction(lower)}; {p(total.get('p_value'))}, {block.get('n')} paired seeds"
             + (f", {block['n_dropped']} dropped for a failed cell" if block.get("n_dropped") else "") + ")."]
    for name, what in (("recipe", f"the recipe ({block.get('parts_text')})"), ("mechanism", "the mechanism")):
        share = shares.get(name) or {}
        fraction = share.get("fraction")
        of = f", {100 * fraction:.0f}% of the whole change" if fraction is not None else ""
        other = "the gene's mechanism" if name == "recipe" else "the gene's recipe"
        lines.append(f"Share of {what}: {_change_text(share, metric)} "
                     f"({p(share.get('p_value'))}{of}); its change alone "
                     f"{_recipe_change_text(share.get('alone'), block, metric)}, with {other} "
                     f"{_recipe_change_text(share.get('with'), block, metric)}.")
    inter = block.get("interaction") or {}
    if inter.get("change") is not None:
        units = "log units" if block.get("scale") == "log" else "units"
        shown, low, high = inter["change"], inter.get("ci_low"), inter.get("ci_high")
        span = "" if low is None or high is None else f" [{low:+.4f}, {high:+.4f}]"
        if inter.get("p_value") is not None and inter["p_value"] < alpha:
            better = shown < 0 if lower else shown > 0  # the mechanism helps more with the gene's recipe
            reading = ("the two reinforce each other (each share holds half of their joint gain)" if better
                       else "the two overlap: part of what one does, the other does too")
        else:
            reading = "not distinguishable from 0: the two gains add up"
        lines.append(f"Interaction (the mechanism's change of {label} with the gene's recipe minus its change with "
                     f"the baseline's, {units}): {shown:+.4f}{span} ({p(inter.get('p_value'))}): {reading}.")
    larger = block.get("larger")
    if larger:
        share = shares.get(larger) or {}
        decided = share.get("p_value") is not None and share["p_value"] < alpha
        lines.append(f"The larger share is the {larger}'s" + (
            "." if decided else ", but its own interval reaches 0: more seeds are needed to say it carries the advantage."))
    if block.get("recomputed_from"):
        lines.append(f"These shares were converted from a result written with the older sign "
                     f"({block['recomputed_from']}).")
    return lines


def recipe_mechanism_section(result: Mapping) -> list[str]:
    """The markdown of an ablation's recipe-or-mechanism 2x2 (nothing for a gene without recipe parts)."""
    table = recipe_mechanism_table(result)
    if table is None:
        return []
    block = result["recipe_vs_mechanism"]
    cells = block.get("cells") or {}
    lines = ["## Recipe or mechanism", "",
             f"The gene sets its own training recipe ({md_cell(block.get('parts_text'))}) besides its mechanism, so "
             "its advantage over the baseline may come from either. The four crossings were trained on the same "
             f"seeds; mean {result.get('metric_label', 'perplexity')} [{stats.percent(result.get('confidence', 0.95))} "
             "CI]:", "",
             table_markdown(*table), "",
             "Each share is the mean, seed by seed, of its factor's gain without and with the other (the two orders "
             "of adding them), so the recipe's and the mechanism's shares add up to the whole advantage; a "
             "one-sample t interval each. The interaction test compares the mechanism's per-seed gain with the gene's "
             "recipe against its gain with the baseline's, seed by seed (the exact sign-flip test below "
             f"{stats.EXACT_BELOW} seeds, the paired t-test from there).", ""]
    lines += [f"- {md_cell(t)}" for t in recipe_mechanism_lines(result)] + [""]
    lines += [f"- {md_cell(text.split(' (')[0])}: {code((cells.get(name) or {}).get('gene'), False)}"
              for name, text in RECIPE_CELLS] + [""]
    return lines


def _change_words(result: Mapping, label: str) -> str:
    """What a Δ cell measures: a relative change on a ratio metric's log scale, else a difference."""
    log = any((r.get(key) or {}).get("scale") == "log" for r in result.get("variants", [])
              for key in ("vs_full", "vs_baseline"))
    return (f"the relative change of {label} in % (from per-seed differences of log values)" if log
            else f"the difference in {label}")


def ablation_markdown(result: Mapping) -> str:
    """The text of ``ablation.md``."""
    seeds = result.get("seeds") or []
    label = result.get("metric_label", "perplexity")
    lines = [
        f"# Ablation of {md_cell(result.get('str'))} ({code(result.get('gene'), False)})", "",
        f"Each variant was trained with seeds {', '.join(map(str, seeds))} ({seed_note(result)}), "
        f"{result.get('steps')} steps each, on the {result.get('eval_split')} split. "
        f"Δ is the variant's paired change from the full gene and from the baseline, seed by seed: "
        f"{_change_words(result, label)}, with its {stats.percent(result.get('confidence', 0.95))} paired t "
        f"interval; the exact sign-flip test decides below {stats.EXACT_BELOW} seeds, the paired t-test from "
        f"{stats.EXACT_BELOW}; "
        "p-values are Holm-corrected within each column." + (f" {GRID_SENTENCE}" if result.get("grid") else ""), "",
        *([partial, ""] if (partial := partial_note(result)) else []),
        f"Learning-rate schedule: {study_schedule(result)}.", "",
        table_markdown(*ablation_table(result), code_column=2), "",
        "## Contributions", "",
        contribution_sign(result), "",
    ]
    lines += [f"- {md_cell(t)}" for t in contribution_lines(result)] + [""]
    lines += recipe_mechanism_section(result)
    lines += [f"![Contributions]({output_stem('ablation', result.get('eval_split', 'valid'))}.png)", ""]
    lines += grid_section(result, "ablation", names={r["gene"]: r["name"] for r in reversed(result.get("variants", []))})
    return "\n".join(lines)
