"""A multi-seed validation: reads a validation result (``baseline`` and ``genes`` rows with their per-seed
``values``, mean, interval and paired comparison; ``seeds``, ``metric``, ``confidence``, ``family_size``, an
optional ``grid``) and renders its verdict table, headline and ``validation.md``; what each gene costs
(``cost``: medians over its seeds, relative to the baseline's; None for a result written before costs were
kept); and a run directory's study results as the report reads them (``read_studies``, ``current_validation``).
"""

from __future__ import annotations

from typing import Mapping

from evo_attention.report.attachments import load_attachments, output_stem
from evo_attention.report.studies.ablation import ablation_markdown, current_ablation
from evo_attention.report.studies.common import (change_text, ci_text, comparison_note, digits_for, metric_direction,
                                                 p_text, paired_change_header, partial_note, plain_cell, seed_note,
                                                 study_schedule, table_markdown, verdict_cell)
from evo_attention.report.studies.curves import curve_markdown
from evo_attention.report.studies.fresh_check import check_line, check_markdown
from evo_attention.report.studies.lr_grid import GRID_SENTENCE, grid_rate_cell, grid_rates, grid_section
from evo_attention.report.studies.maps import maps_section
from evo_attention.report.studies.suite import suite_markdown
from evo_attention.report.studies.transfer import current_transfer, transfer_markdown
from evo_attention.util import stats
from evo_attention.util.format import fmt, md_cell, number


def validation_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of the validation table in plain text, the gene key first (the baseline's first)."""
    d = digits_for(result.get("metric", ""))
    conf = stats.percent(result.get("confidence", 0.95))
    search_seed = result.get("search_seed")
    show_search = any(r.get("search_value") is not None for r in result.get("genes", []))
    family = result.get("family_size") or len(result.get("genes", []))
    rates = grid_rates(result)
    headers = ["Gene", "Seeds ok"] + (["lr"] if rates else []) + ["Mean ± sd", f"{conf} CI"]
    headers += ["Search" + (f" (seed {search_seed})" if search_seed is not None else "")] if show_search else []
    headers += [paired_change_header(result.get("metric", ""), conf), "Unpaired (Welch)", "p (paired)",
                f"p (Holm, {family})", "Verdict"]
    matched = list(result.get("matched_baselines") or [])
    headers += ["Versus the plain baseline"] if matched else []
    rows = []
    for r in [result.get("baseline") or {}] + matched + list(result.get("genes", [])):
        is_base = r is result.get("baseline") or r in matched
        n_ok = len(r.get("values") or []) - (r.get("n_failed") or 0)
        name = str(r.get("gene", ""))
        if r in matched:
            name = f"{name} (FFN {r.get('d_ff')}, {r.get('params'):,} parameters)"
        elif is_base and matched:
            plain = result.get("plain_baseline") or {}
            name = f"{name} (plain: FFN {plain.get('d_ff')}, {plain.get('params') or 0:,} parameters)"
        cells = [name, f"{n_ok}/{len(r.get('values') or [])}"]
        cells += [grid_rate_cell(rates.get(r.get("gene")))] if rates else []
        cells += [f"{fmt(r.get('mean'), d)} ± {fmt(r.get('sd'), d)}", ci_text(r.get("ci_low"), r.get("ci_high"), d)]
        cells += [fmt(r.get("search_value"), d)] if show_search else []
        if is_base:
            role = ("matched baseline of " + ", ".join(str(k) for k in r.get("matched_to", [])) if r in matched
                    else "plain baseline" if matched else "baseline (reference)")
            cells += ["-"] * 4 + [role] + (["-"] if matched else [])
        else:
            cells += [change_text(r, result.get("metric", "")), welch_change_text(r), p_text(r.get("p_value")),
                      p_text(r.get("p_holm")), verdict_cell(r)]
            cells += [plain_cell(r, result.get("metric", ""))] if matched else []
        rows.append(cells)
    return headers, rows, "l" + "r" * (len(headers) - 2) + "l"


def welch_change_text(row: Mapping) -> str:
    """The unpaired (Welch) difference the paired one replaces, in % of the baseline's mean."""
    w = row.get("welch") or {}
    if w.get("difference_percent") is None:
        return "-"
    low, high = w.get("diff_ci_low_percent"), w.get("diff_ci_high_percent")
    span = "" if low is None or high is None else f" [{low:+.2f}, {high:+.2f}]"
    return f"{w['difference_percent']:+.2f}%{span}"


def validation_best_row(result: Mapping) -> dict | None:
    """The validated gene with the best mean (None if none has a value)."""
    rows = [r for r in result.get("genes", []) if r.get("mean") is not None]
    if not rows:
        return None
    sign = 1 if result.get("lower_is_better", True) else -1
    return min(rows, key=lambda r: (sign * r["mean"], r["gene"]))


def validation_headline(result: Mapping) -> str:
    """One sentence: the best validated gene vs the baseline, its paired change and the verdict."""
    best = validation_best_row(result)
    matched = (b for b in result.get("matched_baselines") or []
               if best and best.get("gene") in b.get("matched_to", []))
    base = next(matched, None) or result.get("baseline") or {}  # the one the best gene's verdict used
    label, conf, d = result.get("metric_label", "perplexity"), stats.percent(result.get("confidence", 0.95)), \
        digits_for(result.get("metric", ""))
    seeds = result.get("seeds") or []
    split = "validation" if result.get("eval_split") == "valid" else str(result.get("eval_split"))
    span = f"{len(seeds)} seeds ({seeds[0]}..{seeds[-1]})" if seeds else "no seeds"
    if best is None:
        return f"No validated gene finished a training ({span}, {split} split)."
    text = (f"{best.get('str', best.get('gene'))} {split} {label} {fmt(best['mean'], d)} {conf} CI "
            f"{ci_text(best.get('ci_low'), best.get('ci_high'), d)}"
            f" vs {'the matched baseline (FFN ' + str(base.get('d_ff')) + ')' if base.get('matched_to') else 'baseline'}"
            f" {fmt(base.get('mean'), d)} {ci_text(base.get('ci_low'), base.get('ci_high'), d)}")
    if best.get("difference") is not None:
        text += (f"; paired change {change_text(best, result.get('metric', ''))} "
                 f"({metric_direction(result.get('metric', ''))})")
    if best.get("p_holm") is not None:
        family = result.get("family_size") or len(result.get("genes", []))
        text += f", Holm p = {best['p_holm']:.3g} over {family} comparison{'s' if family != 1 else ''}"
    return text + f" over {span}: **{verdict_cell(best)}**."


def validation_table_markdown(result: Mapping) -> str:
    """The verdict table of a validation result, as ``validation.md`` (and the docs) show it."""
    return table_markdown(*validation_table(result), code_column=0) + "\n"


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
        *([partial, ""] if (partial := partial_note(result)) else []),
        f"Learning-rate schedule: {study_schedule(result)}.", "",
        *([f"Seeds planned from a pilot: {result['seed_plan']['plan']}.", ""]
          if (result.get("seed_plan") or {}).get("plan") else []),
        validation_table_markdown(result).rstrip(), "",
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


def cost_table(result: Mapping) -> tuple[list[str], list[list[str]], str] | None:
    """(headers, rows, align) of what each validated gene costs (medians over its seeds), or None without costs."""
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


def cost_markdown(result: Mapping) -> str | None:
    """The cost table of a validation result as markdown; None for a result without costs."""
    costs = cost_table(result)
    return None if costs is None else table_markdown(*costs, code_column=0) + "\n"  # cells hold no | or newline


def read_studies(run_dir):
    """The study results in ``run_dir`` (``load_attachments``) by the current rule: a validation of an earlier
    ``analysis`` (or none) is recomputed from its per-seed values and marked so; ablations and transfers of the
    older sign (positive = better) are read in the current one (marked by ``recomputed_from``). Every file but
    compare's (its table formats any value) passes ``_readable``."""
    found = load_attachments(run_dir)
    checks = [found.fresh_check] if found.fresh_check else []  # the renderers' baseline word reads no field
    for results, read, render in ((found.validations, current_validation, validation_markdown),
                                  (found.suites, current_validation, suite_markdown),
                                  (found.ablations, current_ablation, ablation_markdown),
                                  (found.transfers, current_transfer, transfer_markdown),
                                  (found.curves, dict, curve_markdown),
                                  (found.maps, dict, maps_section),
                                  (checks, dict, lambda c: check_line(c, "vanilla") + check_markdown(c, "vanilla"))):
        results[:] = [r for result in results if (r := _readable(result, read, render, found.problems))]
    found.fresh_check = checks[0] if checks else None
    return found


def _readable(result: Mapping, read, render, problems: list[str]) -> dict | None:
    """``read(result)``, if rendering it whole (``render``) reads every field as its command writes it; else None,
    named damaged in ``problems`` (the report and status leave it out instead of failing on it)."""
    try:
        render(current := read(result))
        return current
    except (TypeError, ValueError, LookupError, AttributeError) as exc:  # ValueError: UserError too (values no numbers)
        problems.append(f"{result['_file']}: damaged: a field is not what its command writes "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
        return None


def current_validation(result: Mapping) -> dict:
    """A (suite) validation by the current rule (``stats.recompute_validation``, with the file's own margin); a
    recomputed one keeps the analysis it was written by in ``recomputed_from`` and says so in its headline."""
    if result.get("analysis") == stats.ANALYSIS:
        return dict(result)
    upgraded = stats.recompute_validation(result, margin=result.get("margin") or stats.DEFAULT_MARGIN)
    if upgraded.get("recomputed"):
        upgraded["recomputed_from"] = result.get("analysis") or "welch"
        upgraded["headline"] = (validation_headline(upgraded) + f" (recomputed by the {stats.ANALYSIS} rule from "
                                f"the stored per-seed values of a {upgraded['recomputed_from']} result)")
    return upgraded
