"""Transfer across scale: reads a transfer result (the ladder's ``sizes``, each with its shape, budget,
Kendall's tau and ``baseline`` and ``genes`` rows with their paired comparison, ``relative_change`` and
interval, ``interaction`` with the reference size and ``transfer`` verdict; an optional ``grid``) and renders
the ladder and gene tables, the headline, the note on how the numbers were made, and ``transfer.md``. Every
change is the gene's minus the baseline's, the direction said with it; ``current_transfer`` reads a result
written with the older ``advantage`` (positive = better) in this sign.
"""

from __future__ import annotations

from typing import Mapping

from evo_attention.report.attachments import output_stem
from evo_attention.report.studies.common import (change_text, ci_text, digits_for, lower_is_better, metric_direction,
                                                 p_text, paired_change_header, partial_note, plain_cell, schedule_text,
                                                 seed_note, table_markdown, verdict_cell)
from evo_attention.report.studies.lr_grid import GRID_SENTENCE, grid_rate_cell, grid_rates, grid_section
from evo_attention.util import stats
from evo_attention.util.format import fmt, md_cell


def transfer_share(value) -> str:
    """A fraction as a percentage: 0.031 -> '+3.1%' ('-' when missing)."""
    return "-" if value is None else f"{100 * value:+.1f}%"


def transfer_change_text(row: Mapping, metric: str) -> str:
    """A gene's relative change with its interval, '-3.1% [-5.2%, -1.0%]' (the interval '-' without an end);
    where the baseline's mean is 0 its difference, so said."""
    if row.get("relative_change") is None and row.get("difference") is not None:
        return f"{change_text(row, metric)} (the baseline's mean is 0: no relative change)"
    low, high = row.get("relative_change_low"), row.get("relative_change_high")
    interval = "-" if low is None or high is None else f"[{transfer_share(low)}, {transfer_share(high)}]"
    return f"{transfer_share(row.get('relative_change'))} {interval}"


def _transfer_best(result: Mapping) -> dict | None:
    """The gene with the best relative change at the reference size, else (a baseline mean 0) the best
    difference; None if none has one."""
    sizes = result.get("sizes") or []
    sign = -1.0 if lower_is_better(result.get("metric", "val_perplexity")) else 1.0
    for field in ("relative_change", "difference"):
        rows = [r for r in (sizes[0].get("genes", []) if sizes else []) if r.get(field) is not None]
        if rows:
            return max(rows, key=lambda r: (sign * r[field], r["gene"]))
    return None


# the older transfer results' field (positive = better), named in ``recomputed_from``
OLDER_ADVANTAGE = "advantage, positive = better"


def current_transfer(result: Mapping) -> dict:
    """``result`` in the current sign: each row's older ``advantage[_low|_high]`` (positive = better) becomes
    ``relative_change[_low|_high]`` (negated when lower is better), the headline is written anew, and
    ``recomputed_from`` names the older field."""
    sizes = result.get("sizes") or []
    if not any("advantage" in g for s in sizes for g in s.get("genes", [])):
        return dict(result)
    sign = -1.0 if result.get("lower_is_better", lower_is_better(result.get("metric", "val_perplexity"))) else 1.0

    def mapped(g: Mapping) -> dict:
        row = {k: v for k, v in g.items() if not k.startswith("advantage")}
        value, low, high = (g.get(k) for k in ("advantage", "advantage_low", "advantage_high"))
        ends = sorted((sign * low, sign * high)) if low is not None and high is not None else (None, None)
        return {**row, "relative_change": None if value is None else sign * value,
                "relative_change_low": ends[0], "relative_change_high": ends[1]}

    out = {**result, "sizes": [{**s, "genes": [mapped(g) for g in s.get("genes", [])]} for s in sizes],
           "recomputed_from": OLDER_ADVANTAGE}
    out["headline"] = transfer_headline(out) + f" (read in the current sign from a result written with the older " \
                                               f"{OLDER_ADVANTAGE})"
    return out


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
    what = f"its advantage over the baseline **{said[verdict]}**" if verdict in said else f"**{verdict}**"
    metric = result.get("metric", "val_perplexity")
    direction, tau = metric_direction(metric), top.get("kendall_tau")
    return (f"{best['str']} from {sizes[0]['size']} to {top['size']} ({fmt(top.get('params'))} parameters): {what} "
            f"(change vs baseline {transfer_change_text(best, metric)} -> {transfer_change_text(at_top, metric)}, "
            f"{conf} intervals, {direction}); Kendall's tau between the rankings of the {fmt(top.get('kendall_n'))} "
            f"(genes and baseline) at the two sizes {fmt(tau, 2)}.")


def transfer_sizes_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of the ladder: shape, budget, the baseline's parameters, Kendall's tau."""
    ref = result.get("reference", "")
    headers = ["Size", "Heads", "FFN", "Steps", "Tokens", "Params (baseline)", f"Kendall's tau vs {ref}", "p", "n"]
    rows = [[str(s.get("size")) + (" (reference)" if s.get("reference") else ""), fmt(s.get("n_heads")),
             fmt(s.get("d_ff")), fmt(s.get("steps")), fmt(s.get("tokens")), fmt(s.get("params")),
             "reference" if s.get("reference") else fmt(s.get("kendall_tau"), 2),
             "-" if s.get("reference") else p_text(s.get("kendall_p")), fmt(s.get("kendall_n"))]
            for s in result.get("sizes", [])]
    return headers, rows, "lrrrrrrrr"


def transfer_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of every gene at every size (the baseline first), the gene key in column 1."""
    d = digits_for(result.get("metric", ""))
    conf = stats.percent(result.get("confidence", 0.95))
    grid = bool(result.get("grid"))
    headers = ["Size", "Gene", "Seeds ok"] + (["lr"] if grid else []) + [
        f"Mean [{conf} CI]", paired_change_header(result.get("metric", ""), conf), "p (Holm)", "Verdict",
        "Change of the paired change vs reference (p Holm)", "Params", "Transfer"]
    matched_any = any(s.get("matched_baselines") for s in result.get("sizes", []))
    headers += ["Versus the plain baseline"] if matched_any else []
    rows = []
    for s in result.get("sizes", []):
        rates = grid_rates(result, s.get("size"))
        matched = list(s.get("matched_baselines") or [])
        for r in [s.get("baseline") or {}] + matched + list(s.get("genes", [])):
            n = len(r.get("values") or [])
            name = str(r.get("gene", "")) + (f" (FFN {r.get('d_ff')})" if r in matched else "")
            cells = [str(s.get("size")), name, f"{n - (r.get('n_failed') or 0)}/{n}"]
            cells += [grid_rate_cell(rates.get(r.get("gene")))] if grid else []
            cells += [f"{fmt(r.get('mean'), d)} {ci_text(r.get('ci_low'), r.get('ci_high'), d)}"]
            if r is s.get("baseline") or r in matched:
                role = ("matched baseline of " + ", ".join(r.get("matched_to", [])) if r in matched
                        else "plain baseline" if matched_any else "baseline")
                cells += ["-", "-", "-", "-", fmt(r.get("params")), role] + (["-"] if matched_any else [])
            else:
                cells += [change_text(r, result.get("metric", "")), p_text(r.get("p_holm")), verdict_cell(r),
                          transfer_interaction_text(r.get("interaction")), fmt(r.get("params")), str(r.get("transfer", ""))]
                cells += [plain_cell(r, result.get("metric", ""))] if matched_any else []
            rows.append(cells)
    return headers, rows, "llr" + ("r" if grid else "") + "rrrlrrl" + ("l" if matched_any else "")


def transfer_interaction_text(inter: Mapping | None) -> str:
    """How a gene's paired (log) change changed from the reference size, with its interval and Holm p ('-' at
    the reference size)."""
    if not inter or inter.get("change") is None:
        return "-"
    span = "" if inter.get("ci_low") is None else f" [{inter['ci_low']:+.4f}, {inter['ci_high']:+.4f}]"
    return f"{inter['change']:+.4f}{span} (p {p_text(inter.get('p_holm'))})"


def transfer_note(result: Mapping) -> str:
    """How the numbers were made, in one paragraph."""
    seeds = result.get("seeds") or []
    conf = stats.percent(result.get("confidence", 0.95))
    direction = metric_direction(result.get("metric", "val_perplexity"))
    budget = (f"{result['tokens_per_param']:g} training tokens per baseline parameter at each size"
              if result.get("tokens_per_param") else "the steps listed per size")
    return (f"Every gene and the baseline were trained {len(seeds)} times at each size, with seeds "
            f"{', '.join(map(str, seeds))} ({seed_note(result)}), in the {result.get('block', 'gpt2')} block, for "
            f"{budget}, and measured on the {result.get('eval_split')} split. The reference is "
            f"{result.get('reference')}, the {'search' if result.get('source_run') else 'configured'} size. Means have "
            f"{conf} t intervals. Each gene is compared with the baseline seed by seed at each size (a paired test "
            f"on the per-seed log differences: exact sign-flip below {stats.EXACT_BELOW} seeds, else t, with t "
            f"intervals; the change is relative, so it reads the same at every size); p "
            f"(Holm) is corrected over every comparison of the ladder and those the store holds against the same "
            f"baseline trainings, and decides the verdict (better, worse, equivalent within the margin, or "
            f"undetermined). Every change is the gene's minus the baseline's ({direction}). "
            f"The interaction test asks whether the change from the baseline changes from the reference size: a "
            f"paired test of the per-seed differences of log differences, by the same rule (Holm over genes and "
            f"sizes). The transfer "
            f"word reads the relative change's interval at each size against the reference (the rule below). Kendall's tau "
            f"compares the ranking of the genes and the baseline by their means with the reference size's, when at "
            f"least 4 are ranked." + (MATCHED_SENTENCE if result.get("match_params") else ""))


MATCHED_SENTENCE = (" Parameter-matched baselines: at each size every gene is compared with the vanilla model whose "
                    "feed-forward width gives it the gene's parameter count (within 0.5%), the row named by its FFN "
                    "width; its verdict, advantage and interaction test are against that baseline, and the last "
                    "column keeps its comparison with the plain baseline (Holm over the ladder's plain comparisons).")


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
    lines = [
        "# Transfer across scale", "",
        result.get("headline", ""), "",
        transfer_note(result) + (f" {GRID_SENTENCE} The grid is tuned at every size." if result.get("grid") else ""),
        "", *([partial, ""] if (partial := partial_note(result)) else []),
        table_markdown(*transfer_sizes_table(result)), "",
        "Learning-rate schedule at each size:", "",
        *[f"- {md_cell(line)}" for line in transfer_schedule_lines(result)], "",
        table_markdown(*transfer_table(result), code_column=1), "",
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
