"""What every study's rendering shares: metric labels, the learning-rate schedule in words, and the cells of a
paired comparison with the baseline (change, interval, p, verdict), read from plain result rows (``mean``,
``ci_low``/``ci_high``, ``difference`` or ``relative`` with their intervals, ``p_holm``, ``verdict``, ...)
without knowing which study made them.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from evo_attention.genes import AttentionGene, recipe_of
from evo_attention.util import stats
from evo_attention.util.errors import UserError
from evo_attention.util.format import change_header, code, direction, fmt, markdown_table, md_cell


# metric -> (label, lower is better)
METRICS = {"val_perplexity": ("perplexity", True), "val_loss": ("loss", True), "accuracy": ("accuracy", False),
           "bits_per_byte": ("bits per byte", True), "bits_per_char": ("bits per character", True),
           "suite_accuracy": ("suite accuracy", False)}  # the mean accuracy over a suite's points (train.suite)


def schedule_text(config: Mapping | None, steps: int | None = None, *, grid: Sequence[float] = (),
                  genes: Iterable[str] = (), chosen_on: str = "") -> str:
    """A study's learning-rate schedule in words (``train.config.describe_schedule`` of its config over ``steps``,
    default ``train_steps``): with a ``grid`` each gene's own rate of it (chosen where ``chosen_on`` says); and
    where one of ``genes`` sets its own recipe parts (lr=, wu=, wd=), that they replace the run's for it."""
    from evo_attention.train.config import describe_schedule  # imports torch: only where a schedule is told

    text = describe_schedule(config or {}, steps)
    if grid:
        text = (f"lr each gene's own best of {', '.join(f'{r:g}' for r in grid)}{chosen_on and ' ' + chosen_on}, "
                + text.partition(", ")[2])
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


def ci_text(low, high, digits: int) -> str:
    """An interval as a cell: ``[low, high]`` to ``digits`` decimals, ``-`` when an end is missing."""
    return "-" if low is None or high is None else f"[{fmt(low, digits)}, {fmt(high, digits)}]"


def digits_for(metric: str) -> int:
    return 4 if metric in ("val_loss", "accuracy", "bits_per_byte", "bits_per_char", "suite_accuracy") else 3


def p_text(value) -> str:
    return "-" if value is None else ("< 0.0001" if value < 1e-4 else f"{value:.4f}")


def lower_is_better(metric: str) -> bool:
    """Whether a lower value of ``metric`` is better (True for an unknown name, as for perplexity)."""
    return METRICS.get(metric, ("", True))[1]


def paired_change_header(metric: str, conf: str) -> str:
    """The header of a paired-change column, with the metric's direction (said once per table)."""
    return change_header(f"Paired change [{conf} CI]", lower_is_better(metric))


def metric_direction(metric: str) -> str:
    """``lower is better`` / ``higher is better`` for ``metric``."""
    return direction(lower_is_better(metric))


def change_text(row: Mapping, metric: str) -> str:
    """A gene's paired change from the baseline (gene minus baseline) with its interval: in % on a ratio
    metric's log scale, else in the metric's units."""
    if row.get("scale") == "log" and row.get("relative") is not None:
        low, high = row.get("relative_ci_low"), row.get("relative_ci_high")
        span = "" if low is None or high is None else f" [{100 * low:+.2f}, {100 * high:+.2f}]"
        return f"{100 * row['relative']:+.2f}%{span}"
    if row.get("difference") is None:
        return "-"
    d = digits_for(metric)
    return f"{row['difference']:+.{d}f} {ci_text(row.get('diff_ci_low'), row.get('diff_ci_high'), d)}"


def verdict_cell(row: Mapping) -> str:
    """The verdict as a table shows it; for an undetermined one, what these seeds detect and how many decide."""
    label = str(row.get("verdict_label") or row.get("verdict") or "")
    versus = row.get("versus") or {}
    if versus.get("baseline") == "matched":  # the verdict names the baseline it used
        label += f" [vs the matched baseline, FFN {versus.get('d_ff')}]"
    if row.get("verdict") != stats.UNDETERMINED:
        return label
    n = row.get("n_pairs")
    if n is not None and n < 2:  # no test, so nothing to plan from either
        return f"{label} ({n} paired seed{'s' if n != 1 else ''} finished: a test needs 2)"
    parts = [row["cannot_decide"]] if row.get("cannot_decide") else []
    if row.get("mde_relative") is not None:
        parts.append(f"detects ±{100 * row['mde_relative']:.1f}%")
    elif row.get("mde") is not None:
        parts.append(f"detects ±{row['mde']:.3g}")
    advice = "seeds_to_decide" if "seeds_to_decide" in row else "seeds_for_equivalence"  # older files: the latter
    needed, span = row.get(advice), row.get(f"{advice}_range")
    if needed is None:
        parts.append("more seeds than planned to decide")
    elif span and span[0] is not None and span[0] != needed:  # the plan's range: sd estimate .. its upper bound
        parts.append(f"~{span[0]}..{needed} seeds to decide")
    else:
        parts.append(f"~{needed} seeds to decide")
    return f"{label} ({'; '.join(parts)})"


def comparison_note(result: Mapping) -> str:
    """How the comparisons of a validation-shaped result were made, in words."""
    family = result.get("family_size") or len(result.get("genes", [])) or 1  # a file of no gene: no family
    log = result.get("metric", "val_perplexity") in stats.LOG_SCALE_METRICS
    scale = "of the log values (the change is relative)" if log else "of the values"
    margin = result.get("margin", stats.DEFAULT_MARGIN)
    margin = f"±{100 * margin:g}%" if log else f"±{margin:g}"  # the equivalence margin, relative on the log scale
    recomputed = (" These comparisons were recomputed by the current rule from the per-seed values of a result "
                  "written by an earlier version." if result.get("recomputed") else "")
    n = len(result.get("seeds") or [])
    floor = stats.cannot_decide(n, 1 - result.get("confidence", 0.95), family) if n else None
    return (f"Each gene is compared with the baseline seed by seed (both trained on the same seeds): a paired "
            f"test on the per-seed differences {scale}, with the t interval ({stats.TEST_RULE}; a bootstrap "
            f"interval, from {stats.BOOTSTRAP_MIN} seeds only, is in the JSON); the unpaired Welch interval it "
            f"replaces is shown beside it. p (Holm) is corrected over the "
            f"{family} comparison{'s' if family != 1 else ''} made against these baseline trainings. The verdict: "
            f"better or worse when the Holm p < {1 - result.get('confidence', 0.95):.2g}; else equivalent within "
            f"{margin} when the equivalence test (Holm-corrected) says so; else undetermined, with "
            f"the effect these seeds could detect (power 0.8) and how many seeds would decide it (at Holm's level; "
            f"the range runs from the observed sd to its 80% upper confidence bound)."
            + (f" {floor}." if floor else "") + recomputed)


def seed_note(result: Mapping) -> str:
    if result.get("search_seed") is not None:
        return f"not the search seed {result['search_seed']}, on which the search picked its winners"
    seed = (result.get("config") or {}).get("seed")
    return f"seed + 1 ... seed + N of the configured seed {seed}, which itself is left out"


def study_schedule(result: Mapping, steps: int | None = None) -> str:
    """``schedule_text`` of a validation- or ablation-shaped result (its config, steps, grid and genes)."""
    genes = [r.get("gene") for r in list(result.get("genes") or []) + list(result.get("variants") or [])]
    steps = steps if steps is not None else result.get("steps") if isinstance(result.get("steps"), int) else None
    return schedule_text(result.get("config"), steps, grid=(result.get("grid") or {}).get("rates") or (),
                         genes=[str(g) for g in genes if g])


def table_markdown(headers: Sequence[str], rows: Sequence[Sequence], align, code_column: int | None = None) -> str:
    """Plain-text cells as a markdown table without a trailing newline: escaped (None as '-'), but those of
    ``code_column`` (gene keys) as code."""
    return markdown_table(headers, [[code(c) if i == code_column else md_cell("-" if c is None else c)
                                     for i, c in enumerate(row)] for row in rows], align).rstrip()


def plain_cell(row: Mapping, metric: str) -> str:
    """A gene's paired change and verdict against the plain baseline, beside a matched one's."""
    plain = row.get("versus_plain") or {}
    if not plain:
        return "-"
    return f"{change_text(plain, metric)}, {plain.get('verdict_label') or plain.get('verdict') or '-'}"


def partial_note(result: Mapping) -> str:
    """The sentence that eval_steps cut a study's evaluations short, with the tokens each value was scored on
    (``eval_tokens``) and the split's; '' when every evaluation was complete (or the rows do not say)."""
    genes = result.get("genes") or ()  # a fitness check's by gene key
    rows = [result.get("baseline") or {}, *(result.get("matched_baselines") or ()),
            *(genes.values() if isinstance(genes, Mapping) else genes), *(result.get("variants") or ())]
    rows += [r for size in result.get("sizes") or () for r in [size.get("baseline") or {}, *(size.get("genes") or ())]]
    rows += result.get("results") or []  # compare's, one per configuration and seed
    # per point: a suite study's (each row's) and a fitness check's (the result's) by label, a curve's (each gene's)
    for r in [result, *rows]:
        points = r.get("points")
        points = points.values() if isinstance(points, Mapping) else points if isinstance(points, list) else ()
        rows += [p for p in points if isinstance(p, Mapping)]
    partial = [r.get("eval_tokens") for r in rows if r.get("eval_complete") is False]
    if not partial:
        return ""
    counts = sorted({n for c in partial for n in (c if isinstance(c, list) else [c]) if n is not None})
    span = f"{counts[0]:,}" if len(counts) == 1 else f"{counts[0]:,} to {counts[-1]:,}" if counts else "part"
    split = result.get("eval_split", "valid")
    settings = result.get("settings") or {}  # compare's provenance
    total = ((result.get("data") or settings.get("data_description") or {}).get("scored_tokens") or {}).get(split)
    return (f"Partial evaluation: eval_steps {(result.get('config') or settings).get('eval_steps')} cut the evaluation "
            f"short, so each value is measured on {span} of the {'' if total is None else f'{total:,} '}scored tokens "
            f"of the {split} split (eval_tokens in the JSON), not on the whole split.")
