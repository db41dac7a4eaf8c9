"""A comparison of configurations at one model size: reads the payload of ``compare.json`` (``settings``,
``aggregates``, the ``summary`` with its ranking, failures and, with several seeds, ``paired`` comparisons; an
optional ``grid``) and renders ``compare.md``."""

from __future__ import annotations

from evo_attention.report.attachments import COMPARE_FIGURE
from evo_attention.report.studies.common import change_text, partial_note, schedule_text, verdict_cell
from evo_attention.report.studies.lr_grid import grid_section
from evo_attention.util import stats
from evo_attention.util.format import code, md_cell, number, signed_change


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
        + f"seed{'s' if seeds > 1 else ''} {', '.join(map(str, s['seed_list']))}."
        + (f" Loss is the mean ± sd over {seeds} seeds." if seeds > 1 else ""),
        "",
        "| rank | name | gene | val loss | perplexity | change vs baseline (lower is better) | accuracy | params | time (s) | peak MB | status |"
        .replace("| accuracy |", "| accuracy | bits/byte |" if text else "| accuracy |"),
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |" + (" ---: |" if text else ""),
    ]
    paired = summary.get("paired") or {}
    for row in summary["ranking"]:
        a = aggregates[row["name"]]
        loss = number(a["val_loss"], ".4f") + (f" ± {number(a['val_loss_sd'], '.4f')}" if seeds > 1 else "")
        change = signed_change(row["perplexity_change_pct"])
        if row["name"] in paired:  # several seeds: the paired change with its interval and verdict
            change = f"{change_text(paired[row['name']], 'val_perplexity')}: {verdict_cell(paired[row['name']])}"
        lines.append(f"| {row['rank']} | {md_cell(a['name'])} | {code(a['gene'])} | {loss} | "
                     f"{number(a['val_perplexity'], '.2f')} | {change} | {number(a['accuracy'], '.4f')} | "
                     + (f"{number(a.get('bits_per_byte'), '.4f')} | " if text else "") + f"{number(a['params'], ',.0f')} | "
                     f"{number(a['time_s'], '.1f')} | {number(a['peak_memory_mb'], '.0f')} | {a['status']} |")
    for failed in summary["failed"]:
        a = aggregates[failed["name"]]
        why = "; ".join(failed["errors"]) or failed["status"]
        lines.append(f"| - | {md_cell(a['name'])} | {code(a['gene'])} | - | - | - | - | {'- | ' if text else ''}"
                     f"{number(a['params'], ',.0f')} | {number(a['time_s'], '.1f')} | "
                     f"{number(a['peak_memory_mb'], '.0f')} | {a['status']}: {md_cell(why)} |")
    if s.get("match_params"):
        lines += ["", "Parameter-matched baselines: each configuration is judged against the vanilla model whose "
                  "feed-forward width gives it the configuration's parameter count within 0.5% (rows "
                  "`baseline (FFN W)`; the configuration's own width where that is the plain one): "
                  + "; ".join(f"{md_cell(name)} {m['candidate_params']:,} parameters -> FFN {m['ffn_dim']} "
                              f"({m['params']:,})" for name, m in s["match_params"].items()) + "."]
    if paired:
        family = max((p.get("family_size") or 0 for p in paired.values()), default=0)
        lines += ["", f"change vs baseline: the change of perplexity paired by seed (a paired test on the per-seed log "
                  f"perplexities, exact sign-flip below {stats.EXACT_BELOW} seeds, else t; its 95% t interval), "
                  f"with the verdict (Holm over {family} comparisons; equivalence "
                  f"within ±{100 * (s.get('margin') or stats.DEFAULT_MARGIN):g}%; see docs/validation.md)."]
    lines += ["", partial] if (partial := partial_note(payload)) else []
    lines += ["", f"Validation loss across the {summary['n_ok']} configurations that trained: "
              f"{number(summary['val_loss_mean'], '.4f')} ± {number(summary['val_loss_sd'], '.4f')} (mean ± sd)."
              + ("" if summary.get("total_time_s") is None else f" Total time {summary['total_time_s']:.0f} s."),
              "", f"![comparison]({COMPARE_FIGURE})", ""]
    if payload.get("grid"):
        names = {c["gene"]: c["name"] for c in reversed(s.get("configs") or [])}
        lines += grid_section({**payload, "eval_split": "valid"}, "compare", names=names)
    return "\n".join(lines)
