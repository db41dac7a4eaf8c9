"""The statistics of a multi-seed comparison: means with t confidence intervals, Welch's t-test,
Holm's step-down correction, Cohen's d, and a verdict in words.

``transfer_verdict`` reads a gene's advantage over the baseline at two model sizes (see there).

Every distribution comes from ``scipy.stats`` (``t.interval`` for the mean's interval,
``ttest_ind(..., equal_var=False)`` for Welch's test and its confidence interval); only Holm's
correction, a few lines, is written here.

Conventions:

- ``difference = mean(candidate) - mean(reference)``, in the units of the metric. For perplexity
  and loss (lower is better) a negative difference is an improvement; ``lower_is_better=False``
  (accuracy) flips that reading, never the sign of the number.
- Cohen's d is the difference over the pooled standard deviation (n - 1 weights), with the same
  sign as the difference.
- A comparison needs at least two values on each side; with fewer, its p-value is None and the
  verdict says there are not enough seeds. Two samples without any spread (every value equal on
  both sides) are decided exactly: equal means give p = 1, different means p = 0.
"""

from __future__ import annotations

import math
import warnings
from typing import Iterable, Sequence

import numpy as np
from scipy import stats as _st

BETTER = "better than baseline"
WORSE = "worse than baseline"
SAME = "not distinguishable"
TOO_FEW = "not enough seeds"

# how an advantage fares from a reference model size to another (``transfer_verdict``)
REFERENCE = "reference"
HOLDS, SHRINKS, VANISHES, REVERSES = "holds", "shrinks", "vanishes", "reverses"
NO_ADVANTAGE = "no advantage at the reference size"
# the rule in words, in the order it is applied (reports show it next to the verdicts)
TRANSFER_RULE = (
    (TOO_FEW, "an interval is missing at either size"),
    (NO_ADVANTAGE, "at the reference size the advantage's interval reaches 0 or below: nothing to carry over"),
    (REVERSES, "the interval at this size lies wholly below 0: the gene is worse than the baseline here"),
    (VANISHES, "the interval at this size contains 0"),
    (SHRINKS, "the interval at this size lies above 0 but wholly below the advantage at the reference size"),
    (HOLDS, "the interval at this size lies above 0 and reaches the advantage at the reference size (or beyond)"),
)


def _clean(values: Iterable) -> np.ndarray:
    """The finite numbers of ``values`` as a float array (None, NaN and inf dropped)."""
    out = []
    for v in values:
        if v is None or isinstance(v, bool):
            continue
        try:
            x = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(x):
            out.append(x)
    return np.asarray(out, dtype=float)


def describe(values: Iterable, confidence: float = 0.95) -> dict:
    """``{"n", "mean", "sd", "ci_low", "ci_high"}`` of the finite ``values``.

    The interval is the t interval of the mean (``scipy.stats.t.interval`` with n - 1 degrees of
    freedom); it needs n >= 2 (None otherwise). ``sd`` is the sample standard deviation.
    """
    check_confidence(confidence)
    x = _clean(values)
    n = int(x.size)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "ci_low": None, "ci_high": None}
    mean = float(x.mean())
    if n == 1:
        return {"n": 1, "mean": mean, "sd": None, "ci_low": None, "ci_high": None}
    sd = float(x.std(ddof=1))
    if sd == 0.0:
        low = high = mean
    else:
        low, high = _st.t.interval(confidence, n - 1, loc=mean, scale=sd / math.sqrt(n))
    return {"n": n, "mean": mean, "sd": sd, "ci_low": float(low), "ci_high": float(high)}


def cohens_d(candidate: Iterable, reference: Iterable) -> float | None:
    """(mean(candidate) - mean(reference)) / pooled sd; None without spread or with n < 2."""
    a, b = _clean(candidate), _clean(reference)
    if a.size < 2 or b.size < 2:
        return None
    pooled = ((a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1)) / (a.size + b.size - 2)
    if pooled <= 0.0:
        return None
    return float((a.mean() - b.mean()) / math.sqrt(pooled))


def welch(candidate: Iterable, reference: Iterable, confidence: float = 0.95) -> dict:
    """Welch's unequal-variance comparison of two samples.

    Returns ``{"difference", "diff_ci_low", "diff_ci_high", "t", "df", "p_value", "cohens_d"}``
    (two-sided p-value; the interval is the Welch interval of the difference of means).
    """
    check_confidence(confidence)
    a, b = _clean(candidate), _clean(reference)
    out = {"difference": None, "diff_ci_low": None, "diff_ci_high": None, "t": None, "df": None,
           "p_value": None, "cohens_d": None}
    if a.size and b.size:
        out["difference"] = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return out
    out["cohens_d"] = cohens_d(a, b)
    if a.var(ddof=1) == 0.0 and b.var(ddof=1) == 0.0:  # no spread at all: decided exactly
        diff = out["difference"]
        out.update(diff_ci_low=diff, diff_ci_high=diff, p_value=1.0 if diff == 0.0 else 0.0)
        return out
    with warnings.catch_warnings():  # scipy warns about nearly identical data; the numbers stand
        warnings.simplefilter("ignore", RuntimeWarning)
        result = _st.ttest_ind(a, b, equal_var=False)
        interval = result.confidence_interval(confidence_level=confidence)
    out.update(t=float(result.statistic), df=float(result.df), p_value=float(result.pvalue),
               diff_ci_low=float(interval.low), diff_ci_high=float(interval.high))
    return out


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the order given (None entries are skipped and stay
    None; the family is the other entries).

    Sorted ascending, the i-th smallest of m p-values becomes ``min(1, (m - i) * p)`` (i from 0),
    made non-decreasing along the order; reject where the adjusted value is below alpha.
    """
    present = [(p, i) for i, p in enumerate(p_values) if p is not None]
    m = len(present)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (m - rank) * float(p)))
        adjusted[i] = running
    return adjusted


def verdict(difference: float | None, p_adjusted: float | None, confidence: float = 0.95,
            lower_is_better: bool = True) -> str:
    """The comparison in words: 'better than baseline at 95%', 'worse than baseline at 95%',
    'not distinguishable' or 'not enough seeds'."""
    if p_adjusted is None or difference is None:
        return TOO_FEW
    if p_adjusted >= 1.0 - confidence or difference == 0.0:
        return SAME
    improves = difference < 0 if lower_is_better else difference > 0
    return f"{BETTER if improves else WORSE} at {percent(confidence)}"


def transfer_verdict(reference: dict, current: dict) -> str:
    """How a gene's advantage at a reference size fares at another size: ``TRANSFER_RULE``, the first
    that applies, read from ``{"advantage", "advantage_low", "advantage_high"}`` at both sizes (the
    improvement over the baseline in any unit where positive is better, and its interval)."""
    ref_low, ref_value = reference.get("advantage_low"), reference.get("advantage")
    low, high = current.get("advantage_low"), current.get("advantage_high")
    if None in (ref_low, ref_value, low, high):
        return TOO_FEW
    if ref_low <= 0:
        return NO_ADVANTAGE
    if high < 0:
        return REVERSES
    if low <= 0:
        return VANISHES
    if high < ref_value:
        return SHRINKS
    return HOLDS


def percent(confidence: float) -> str:
    """0.95 -> '95%', 0.995 -> '99.5%'."""
    return f"{100 * confidence:g}%"


def compare(samples: dict[str, Iterable], reference: Iterable, confidence: float = 0.95,
            lower_is_better: bool = True) -> dict[str, dict]:
    """Every sample against the reference: ``describe`` + ``welch`` + Holm-adjusted p-value
    (``p_holm``, over the samples that have a p-value) + ``verdict``; keyed like ``samples``."""
    rows = {name: {**describe(values, confidence), **welch(values, reference, confidence)}
            for name, values in samples.items()}
    names = list(rows)
    for name, p in zip(names, holm([rows[n]["p_value"] for n in names])):
        rows[name]["p_holm"] = p
        rows[name]["verdict"] = verdict(rows[name]["difference"], p, confidence, lower_is_better)
    return rows


def check_confidence(confidence: float) -> None:
    """UserError unless ``confidence`` is a level in [0.5, 1)."""
    from evo_attention.util.errors import UserError

    if not isinstance(confidence, (int, float)) or not 0.5 <= confidence < 1.0:
        raise UserError(f"confidence {confidence!r} is outside [0.5, 1): use e.g. 0.95")
