"""How a study's result reads: the tables and markdown of validate, ablate and compare results.

The studies (``evo_attention.studies``) write their ``*.md`` files with these functions, and the
run report renders the same tables from the ``*.json`` files they left, so the two always agree.
Everything here reads plain result dicts (as written to JSON); nothing imports a study.
"""

from __future__ import annotations

from typing import Mapping

from evo_attention.report.attachments import COMPARE_FIGURE, output_stem
from evo_attention.util import stats
from evo_attention.util.errors import UserError
from evo_attention.util.format import code, fmt, markdown_table, md_cell, number


# metric -> (label, lower is better)
METRICS = {"val_perplexity": ("perplexity", True), "val_loss": ("loss", True), "accuracy": ("accuracy", False),
           "bits_per_byte": ("bits per byte", True), "bits_per_char": ("bits per character", True)}
# gene field -> how an ablation names it
FIELD_LABELS = {"similarity": "similarity", "normalization": "normalization", "gating": "gating",
                "temperature_mode": "temperature", "use_bias": "bias", "attention_dropout": "attention dropout"}


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
    return 4 if metric in ("val_loss", "accuracy", "bits_per_byte", "bits_per_char") else 3


def validation_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of the validation table; cells are plain text, the first column the
    gene key (the baseline first)."""
    d = digits_for(result.get("metric", ""))
    conf = stats.percent(result.get("confidence", 0.95))
    search_seed = result.get("search_seed")
    show_search = any(r.get("search_value") is not None for r in result.get("genes", []))
    headers = ["Gene", "Seeds ok", "Mean ± sd", f"{conf} CI"]
    headers += ["Search" + (f" (seed {search_seed})" if search_seed is not None else "")] if show_search else []
    headers += [f"Δ vs baseline [{conf} CI]", "p (Welch)", "p (Holm)", "Cohen's d", "Verdict"]
    rows = []
    for r in [result.get("baseline") or {}] + list(result.get("genes", [])):
        is_base = r is result.get("baseline")
        n_ok = len(r.get("values") or []) - (r.get("n_failed") or 0)
        cells = [str(r.get("gene", "")), f"{n_ok}/{len(r.get('values') or [])}",
                 f"{fmt(r.get('mean'), d)} ± {fmt(r.get('sd'), d)}", interval(r.get("ci_low"), r.get("ci_high"), d)]
        cells += [fmt(r.get("search_value"), d)] if show_search else []
        if is_base:
            cells += ["-"] * 4 + ["baseline (reference)"]
        else:
            diff = r.get("difference")
            cells += ["-" if diff is None else
                      f"{diff:+.{d}f} {interval(r.get('diff_ci_low'), r.get('diff_ci_high'), d)}",
                      p_text(r.get("p_value")), p_text(r.get("p_holm")), fmt(r.get("cohens_d"), 2), str(r.get("verdict", ""))]
        rows.append(cells)
    align = "l" + "r" * (len(headers) - 2) + "l"
    return headers, rows, align


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


def validation_markdown(result: Mapping) -> str:
    """The text of ``validation.md``."""
    headers, rows, align = validation_table(result)
    md_rows = [[md_cell(c) if i != 0 else code(c) for i, c in enumerate(row)] for row in rows]
    seeds = result.get("seeds") or []
    lines = [
        "# Multi-seed validation", "",
        result.get("headline", ""), "",
        f"Every gene and the vanilla baseline were trained {len(seeds)} times, with seeds {', '.join(map(str, seeds))} "
        f"({seed_note(result)}), "
        f"{result.get('steps')} steps each, and measured on the {result.get('eval_split')} split. "
        f"The interval of a mean is a t interval; Δ is mean(gene) − mean(baseline) with Welch's interval and "
        f"two-sided p-value; p (Holm) is corrected across the {_genes(len(result.get('genes', [])))}, and the verdict "
        f"uses it. Cohen's d uses the pooled sd.", "",
        markdown_table(headers, md_rows, align).rstrip(), "",
    ]
    costs = cost_table(result)
    if costs:
        headers, rows, align = costs
        lines += ["What each gene costs, the median over its seeds (in brackets: relative to the baseline). "
                  "FLOPs count one training step's arithmetic; times are those of the machine and executor that "
                  "trained it; latency is one eval-mode forward pass of an evaluation batch.", "",
                  markdown_table(headers, [[code(c) if i == 0 else c for i, c in enumerate(row)] for row in rows],
                                 align).rstrip(), ""]
    failures = [(r["gene"], e) for r in [result.get("baseline") or {}] + list(result.get("genes", []))
                for e in r.get("errors", [])]
    if failures:
        lines += ["Failed trainings (left out of the statistics):", ""]
        lines += [f"- `{g}`: {md_cell(e)}" for g, e in failures] + [""]
    lines += [f"![Per-seed values]({output_stem('validation', result.get('eval_split', 'valid'))}.png)", ""]
    return "\n".join(lines)


def _genes(n: int) -> str:
    return "1 gene" if n == 1 else f"{n} genes"


def seed_note(result: Mapping) -> str:
    if result.get("search_seed") is not None:
        return f"not the search seed {result['search_seed']}, on which the search picked its winners"
    seed = (result.get("config") or {}).get("seed")
    return f"seed + 1 ... seed + N of the configured seed {seed}, which itself is left out"


def ablation_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of the ablation table in plain text."""
    d = digits_for(result.get("metric", ""))
    conf = stats.percent(result.get("confidence", 0.95))
    headers = ["Variant", "What changed", "Key", "Seeds ok", f"Mean [{conf} CI]", "Δ vs full gene", "p (Holm)",
               "Δ vs baseline", "p (Holm)"]
    rows = []
    for r in result.get("variants", []):
        n = len(r.get("values") or [])
        change = str(r.get("change")).split(": ", 1)[-1] if r.get("field") else "-"
        cells = [str(r.get("name")), change, str(r.get("gene")), f"{n - (r.get('n_failed') or 0)}/{n}",
                 f"{fmt(r.get('mean'), d)} {interval(r.get('ci_low'), r.get('ci_high'), d)}"]
        for key in ("vs_full", "vs_baseline"):
            c = r.get(key)
            if not c or c.get("difference") is None:
                cells += ["-", "-"]
            else:
                cells += [f"{c['difference']:+.{d}f} {interval(c.get('diff_ci_low'), c.get('diff_ci_high'), d)}",
                          p_text(c.get("p_holm"))]
        rows.append(cells)
    return headers, rows, "lllrrrrrr"


def contribution_lines(result: Mapping) -> list[str]:
    """Plain sentences: what each field contributes, strongest first."""
    d = digits_for(result.get("metric", ""))
    label = result.get("metric_label", "perplexity")
    alpha = 1.0 - float(result.get("confidence", 0.95))
    lines = []
    total = result.get("total") or {}
    if total.get("value") is not None:
        lines.append(f"Whole gene vs baseline: {label} improves by {total['value']:+.{d}f} "
                     f"{interval(total.get('low'), total.get('high'), d)} "
                     f"({_significance(total, alpha, result.get('confidence', 0.95))}).")
    for kind, text in (("remove", "removing it from the gene costs"), ("add", "adding it alone to the baseline gains")):
        items = [c for c in result.get("contributions", []) if c["kind"] == kind and c.get("value") is not None]
        for c in sorted(items, key=lambda c: -c["value"]):
            lines.append(f"{c['change']}: {text} {c['value']:+.{d}f} {interval(c['low'], c['high'], d)} "
                         f"({_significance(c, alpha, result.get('confidence', 0.95))}).")
    return lines


def _significance(c: Mapping, alpha: float, confidence: float) -> str:
    if c.get("p_holm") is not None and c["p_holm"] < alpha:
        return f"significant at {stats.percent(confidence)} after Holm's correction"
    if c.get("low") is not None and (c["low"] > 0 or c["high"] < 0):
        return "its own interval excludes 0, but not significant after Holm's correction"
    return "not distinguishable from 0"


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
        f"within each column.", "",
        markdown_table(headers, md_rows, align).rstrip(), "",
        "## Contributions", "",
        f"Positive = the field makes the {label} better.", "",
    ]
    lines += [f"- {md_cell(t)}" for t in contribution_lines(result)] + [""]
    lines += [f"![Contributions]({output_stem('ablation', result.get('eval_split', 'valid'))}.png)", ""]
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
        f"lr {s['learning_rate']:g} ({s['lr_schedule']}); seed{'s' if seeds > 1 else ''} "
        f"{', '.join(map(str, s['seed_list']))}."
        + (f" Loss is the mean ± sd over {seeds} seeds." if seeds > 1 else ""),
        "",
        "| rank | name | gene | val loss | perplexity | vs baseline | accuracy | params | time (s) | peak MB | status |"
        .replace("| accuracy |", "| accuracy | bits/byte |" if text else "| accuracy |"),
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |" + (" ---: |" if text else ""),
    ]
    for row in summary["ranking"]:
        a = aggregates[row["name"]]
        loss = number(a["val_loss"], ".4f") + (f" ± {number(a['val_loss_sd'], '.4f')}" if seeds > 1 else "")
        change = "-" if row["perplexity_change_pct"] is None else f"{row['perplexity_change_pct']:+.1f}%"
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
    lines += ["", f"Validation loss across the {summary['n_ok']} configurations that trained: "
              f"{number(summary['val_loss_mean'], '.4f')} ± {number(summary['val_loss_sd'], '.4f')} (mean ± sd)."
              + ("" if summary.get("total_time_s") is None else f" Total time {summary['total_time_s']:.0f} s."),
              "", f"![comparison]({COMPARE_FIGURE})", ""]
    return "\n".join(lines)


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
    headers = ["Size", "Gene", "Seeds ok", f"Mean [{conf} CI]", f"Δ vs baseline [{conf} CI]", "Advantage [CI]",
               "Params", "Verdict"]
    rows = []
    for s in result.get("sizes", []):
        for r in [s.get("baseline") or {}] + list(s.get("genes", [])):
            n = len(r.get("values") or [])
            cells = [str(s.get("size")), str(r.get("gene", "")), f"{n - (r.get('n_failed') or 0)}/{n}",
                     f"{fmt(r.get('mean'), d)} {interval(r.get('ci_low'), r.get('ci_high'), d)}"]
            if r is s.get("baseline"):
                cells += ["-", "-", fmt(r.get("params")), "baseline"]
            else:
                diff = r.get("difference")
                cells += ["-" if diff is None else
                          f"{diff:+.{d}f} {interval(r.get('diff_ci_low'), r.get('diff_ci_high'), d)}",
                          advantage_text(r),
                          fmt(r.get("params")), str(r.get("transfer", ""))]
            rows.append(cells)
    return headers, rows, "llrrrrrl"


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
            f"{conf} t intervals; Δ is mean(gene) − "
            f"mean(baseline) with Welch's interval; the advantage is the improvement over the baseline as a share of "
            f"the baseline's mean at that size, with Δ's interval scaled alike (a share, because the "
            f"{result.get('metric_label', 'perplexity')} itself changes with size). Intervals are per comparison, "
            f"without a multiplicity correction. Kendall's tau compares the ranking of the genes and the baseline by "
            f"their means at each size with the ranking at the reference size.")


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
        transfer_note(result), "",
        markdown_table(headers, [[md_cell(c) for c in row] for row in rows], align).rstrip(), "",
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
    return "\n".join(lines)
