"""The statistics of a multi-seed comparison: means with t confidence intervals, Welch's t-test,
Holm's step-down correction and Cohen's d; and, for a gene and a baseline trained on the same
seeds (same initialisation stream and batch order: the i-th value of each side belongs to the same
seed), the paired comparison (``paired``), its equivalence test (``tost``), a four-word verdict
(``paired_verdict``) and the power calculations that say how many seeds would decide it. Besides:
a change between model sizes (``paired_interaction``, ``transfer_verdict``), solve rates (a seed
solves a task point or stays at the plateau: a bimodal outcome no t-test models; ``solve_rate``,
``solve_rates_versus``, ``seeds_for_solve_rates``) and a 2x2's factor shares (``two_factor_shares``).

``scipy.stats`` gives every distribution and library test; what is written here (``holm``, ``sign_flip``,
``power_paired``, ``power_tost``, the exact test's power, ``_fisher_p_tables``, Cohen's d) says why.

Conventions:

- ``difference = mean(candidate) - mean(reference)``, in the units of the metric. For perplexity
  and loss (lower is better) a negative difference is an improvement; ``lower_is_better=False``
  (accuracy) flips that reading, never the sign of the number.
- Cohen's d is the difference over the pooled standard deviation (n - 1 weights), with the same
  sign as the difference.
- A comparison needs at least two values on each side; with fewer, its p-value is None and the
  verdict says there are not enough seeds. Two samples without any spread (every value equal on
  both sides) are decided exactly: equal means give p = 1, different means p = 0.
- A paired comparison's p-value is that of the test the verdict rule picks (``exact_decides``):
  the exact sign-flip test below ``EXACT_BELOW`` pairs or with a degenerate spread (never p = 0),
  the t-test from there; ``cannot_decide`` says when the seeds cannot reach alpha at all.
- Power is exact for the paired t-test and the TOST; seed counts are the smallest n >= 2 with at
  least the asked power, None beyond ``max_seeds`` (or ``SEEDS_CEILING``) or for an effect that
  can never be detected.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import math
import numbers
import sys
import warnings
from typing import Hashable, Iterable, Mapping, Sequence, TypeVar

import numpy as np

from evo_attention.util.errors import UserError
from evo_attention.util.format import finite_or_none


class _Lazy:
    """A scipy module imported on its first use: a command that reads results without computing a
    test (``status``, ``report``) never pays scipy's start-up (about a second)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(self._name), attr)


_integrate, _optimize, _st, _sc = (_Lazy("scipy.integrate"), _Lazy("scipy.optimize"), _Lazy("scipy.stats"),
                                    _Lazy("scipy.special"))

_Key = TypeVar("_Key", bound=Hashable)

TOO_FEW = "not enough seeds"

# the two tests of a paired comparison; the verdict rule picks one (``exact_decides``)
EXACT_TEST, T_TEST = "sign-flip", "t"
# the four verdicts of a paired comparison (``paired_verdict``)
PAIRED_BETTER, PAIRED_WORSE, EQUIVALENT, UNDETERMINED = "better", "worse", "equivalent", "undetermined"
# the rule in words, in the order it is applied (reports show it next to the verdicts)
PAIRED_RULE = (
    (PAIRED_BETTER, "the paired test's p-value (Holm-adjusted across the family) is below alpha and "
                    "the mean difference favours the gene"),
    (PAIRED_WORSE, "the paired test's p-value (Holm-adjusted across the family) is below alpha and "
                   "the mean difference favours the baseline"),
    (EQUIVALENT, "the equivalence test (two one-sided paired tests against ±margin) has p below alpha"),
    (UNDETERMINED, "neither: more seeds are needed; the verdict says how many"),
)
# which paired test decides, in words (reports show it beside PAIRED_RULE)
TEST_RULE = ("below 12 paired seeds, or when the per-seed differences have (almost) no spread, the exact "
             "sign-flip permutation test decides (all 2^n sign patterns; the t-test's p is shown beside it); "
             "from 12 seeds the paired t-test decides. Its equivalence test is the same test's two one-sided "
             "versions against ±margin")
# when no max_seeds is given, seed counts beyond this are reported as None (not attainable)
SEEDS_CEILING = 10**6

# the verdict rule's choice of test: below this many pairs the exact sign-flip test decides (the
# t-test's normality cannot be checked on so few differences, and its p at 2-4 degrees of freedom is
# far below what any distribution-free test allows; it is reported beside it); from it on the t-test
# decides. A degenerate spread (``degenerate_spread``) is decided exactly at any n.
EXACT_BELOW = 12
# up to this many pairs the sign-flip test enumerates all 2^n sign patterns; beyond, Monte Carlo
EXACT_MAX = 16
# random sign patterns of the Monte Carlo sign-flip test (standard error at most 0.0016)
SIGN_FLIP_RESAMPLES = 100_000
# a spread of the differences at most this fraction of their largest magnitude is rounding noise
DEGENERATE_SPREAD = 1e-9
# seed plans take the pilot's sd at this one-sided upper confidence bound (``sd_upper_bound``)
SD_BOUND_LEVEL = 0.8
# draws of the simulated power of the exact test (``verdict_power``)
EXACT_POWER_REPS = 2000
# bootstrap intervals are computed from this many pairs on: below, BCa's coverage of a nominal 95%
# is 72-88% (n = 3-8), so no interval is given rather than a misleading one
BOOTSTRAP_MIN = 10

# how a gene's change from the baseline fares from a reference model size to another
# (``transfer_verdict``); "the better side" of 0 is below it when lower is better
REFERENCE = "reference"
HOLDS, SHRINKS, VANISHES, REVERSES = "holds", "shrinks", "vanishes", "reverses"
NO_ADVANTAGE = "no advantage at the reference size"
NO_RELATIVE = "no relative change"
# the rule in words, in the order it is applied (reports show it next to the verdicts)
TRANSFER_RULE = (
    (TOO_FEW, "an interval is missing at either size (where the baseline's mean is 0 there is no relative change: "
              "the difference's interval, of the same sign, stands in for it)"),
    (NO_ADVANTAGE, "at the reference size the change's interval reaches 0 or the worse side: nothing to carry over"),
    (REVERSES, "the interval at this size lies wholly on the worse side of 0: the gene is worse than the baseline here"),
    (VANISHES, "the interval at this size contains 0"),
    (NO_RELATIVE, "the interval at this size lies on the better side of 0, but the baseline's mean is 0 at either "
                  "size: there is no relative change to set against the reference size's"),
    (SHRINKS, "the interval at this size lies on the better side of 0 but wholly short of the change at the "
              "reference size"),
    (HOLDS, "the interval at this size lies on the better side of 0 and reaches the change at the reference size "
            "(or beyond)"),
)


def _as_float(x, refusal: str, setting: str) -> float | None:
    """``x`` as a float (NaN and inf kept), None for None and pandas' NA; what float() cannot read, text
    (float() reads 'nan') or a bool of any kind is a UserError (``refusal``, naming ``setting``): a value
    that is no number marks no missing one."""
    if x is None or x is getattr(sys.modules.get("pandas"), "NA", None):  # pd.NA exists once pandas is loaded
        return None
    try:
        if isinstance(x, (bool, str, bytes)) or str(getattr(x, "dtype", "")) in ("bool", "torch.bool"):
            raise TypeError
        return float(x)  # 0-d tensors and arrays, Decimal, numpy scalars
    except (TypeError, ValueError):
        raise UserError(f"{refusal}, not {x!r}", setting=setting) from None


def _seed_value(x) -> float | None:
    """A per-seed value as a float, None for a failed seed (None, NaN, inf, pandas' NA); no number is a UserError."""
    number = _as_float(x, "values must be numbers (None for a failed seed)", "values")
    return number if number is not None and math.isfinite(number) else None


def _clean(values: Iterable) -> np.ndarray:
    """The finite numbers of ``values`` as a float array (failed seeds dropped: ``_seed_value``)."""
    return np.asarray([x for x in map(_seed_value, values) if x is not None], dtype=float)


def describe(values: Iterable, confidence: float = 0.95) -> dict:
    """``{"n", "mean", "sd", "ci_low", "ci_high"}`` of the finite ``values``.

    The interval is the t interval of the mean (``scipy.stats.t.interval`` with n - 1 degrees of
    freedom); it needs n >= 2 (None otherwise). ``sd`` is the sample standard deviation.
    """
    check_confidence(confidence)
    x = _clean(values)
    n = int(x.size)
    mean = float(x.mean()) if n else None
    if n < 2:
        return {"n": n, "mean": mean, "sd": None, "ci_low": None, "ci_high": None}
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
    out = dict.fromkeys(("difference", "diff_ci_low", "diff_ci_high", "t", "df", "p_value", "cohens_d"))
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


def holm(p_values: Iterable[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the order given (any iterable; None and NaN entries, no test, are
    skipped and stay as they are; the family is the other entries; one outside [0, 1] or no number is a
    UserError): sorted ascending, the i-th smallest of m becomes ``min(1, (m - i) * p)`` (i from 0),
    made non-decreasing along the order; reject where the adjusted value is below alpha.

    Not statsmodels' ``multipletests(method="holm")``: the same numbers, but it calls ``gc.collect()``
    every time (statsmodels PR 8671, unmerged), 0.1-0.2 s a call with torch loaded; the seed-plan
    simulations in the tests call this thousands of times.
    """
    p_values, present = list(p_values), []  # an iterator is walked twice below
    for i, p in enumerate(p_values):
        number = _as_float(p, "p-values must be numbers (None where there is no test)", "p_values")
        if number is None or math.isnan(number):
            continue
        if not 0.0 <= number <= 1.0:
            raise UserError(f"p-value {p!r} is outside [0, 1]: pass p-values (None where there is no test)",
                            setting="p_values")
        present.append((number, i))
    m = len(present)
    adjusted: list[float | None] = list(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def transfer_verdict(reference: dict, current: dict, lower_is_better: bool = True) -> str:
    """How a gene's change from the baseline at a reference size fares at another size:
    ``TRANSFER_RULE``, the first that applies, read from ``{"relative_change", "relative_change_low",
    "relative_change_high"}`` at both sizes (the gene minus the baseline, as a fraction of the
    baseline, and its interval; the better side of 0 is below it when ``lower_is_better``); without
    them (the baseline's mean is 0) from ``{"difference", "diff_ci_low", "diff_ci_high"}``, whose
    sign is theirs."""
    sign = -1.0 if lower_is_better else 1.0  # the gain: positive on the better side

    def gain(row: dict, names=("relative_change", "relative_change_low", "relative_change_high")) -> tuple:
        if row.get(names[0]) is None and row.get("difference") is not None:  # the baseline's mean is 0
            return (None, *gain(row, ("difference", "diff_ci_low", "diff_ci_high"))[1:])
        value, low, high = (finite_or_none(row.get(k)) for k in names)  # NaN (a failed size) is missing
        value = None if value is None else sign * value
        if low is None or high is None:
            return value, None, None
        return (value, *sorted((sign * low, sign * high)))

    ref_value, ref_low, _ = gain(reference)
    value, low, high = gain(current)
    if None in (ref_low, low, high):
        return TOO_FEW
    if ref_low <= 0:
        return NO_ADVANTAGE
    if high < 0:
        return REVERSES
    if low <= 0:
        return VANISHES
    if ref_value is None or value is None:
        return NO_RELATIVE
    if high < ref_value:
        return SHRINKS
    return HOLDS


def percent(confidence: float) -> str:
    """0.95 -> '95%', 0.995 -> '99.5%'."""
    return f"{100 * confidence:g}%"


def check_confidence(confidence: float) -> None:
    """UserError unless ``confidence`` is a level in (0.5, 1): a verdict tests at 1 - confidence, a
    significance level below 0.5 (``check_alpha``); a number of any kind (numpy's float32 too)."""
    _check_level(confidence, "confidence", 0.5, 1.0, 0.95)


def check_alpha(alpha: float) -> None:
    """UserError unless ``alpha`` is a significance level in (0, 0.5): a number of any kind (numpy's
    float32 too), never a bool or text."""
    _check_level(alpha, "alpha", 0.0, 0.5, 0.05)


def _check_level(value, name: str, low: float, high: float, example: float) -> None:
    """UserError naming ``name`` unless ``value`` is a number strictly between ``low`` and ``high``."""
    span = f"({low:g}, {high:g})"
    number = _as_float(value, f"{name} must be a number in {span}, e.g. {example:g}", name)
    if number is None or not low < number < high:
        raise UserError(f"{name} {value!r} is outside {span}: use e.g. {example:g}", setting=name)


def holm_family(comparisons: Mapping[_Key, float | None]) -> dict[_Key, float | None]:
    """``holm`` over a family given as ``{key: p-value}``: ``{key: adjusted p-value}``, same keys
    (None stays None and is no member of the family). The caller builds the family, e.g. every
    comparison recorded in one store against the same baseline trainings."""
    return dict(zip(comparisons, holm(list(comparisons.values()))))


# ---------------------------------------------------------------------------------------------
# paired comparisons


def margin_bound(margin: float, log: bool = True) -> float:
    """The equivalence bound on the scale of the differences: ``log(1 + margin)`` on the log scale
    (``margin`` relative, 0.01 = 1%: a ratio of geometric means within ``[1 / (1 + m), 1 + m]``, a
    relative change from ``-m / (1 + m)`` to ``+m``), ``margin`` itself otherwise (metric units)."""
    if not isinstance(margin, numbers.Real) or isinstance(margin, bool) or not margin > 0 \
            or not math.isfinite(margin):
        raise UserError(f"margin {margin!r} must be a positive number: use e.g. 0.01 for 1%")
    return math.log1p(margin) if log else float(margin)


def paired(candidate: Sequence, reference: Sequence, confidence: float = 0.95, *, log: bool = True,
           bootstrap_resamples: int = 9999, bootstrap_method: str = "BCa", seed: int = 0) -> dict:
    """The paired comparison of per-seed values aligned by seed: a pair where either value is None,
    NaN or infinite (a failed seed) is dropped (``n_dropped``). With ``log=True`` (perplexity) the
    differences are ``log(candidate) - log(reference)``, the scale on which perplexity's seed noise
    is additive; with ``log=False`` (bits per byte, loss, accuracy) they are plain.

    Returns the keys of the dict built below: the mean and sd of the per-seed differences, the
    ``ttest_rel`` statistic, degrees of freedom, two-sided p-value (``p_t``) and interval, the exact sign-flip
    p (``p_exact``), the test the verdict rule uses (``test``: ``exact_decides``) and its p (``p_value``), the seeded
    ``scipy.stats.bootstrap`` interval (BCa by default; from ``BOOTSTRAP_MIN`` pairs;
    ``bootstrap_resamples=0`` skips it), and with ``log=True`` the relative change ``exp(difference) - 1``
    with the t interval mapped by the same function (None with ``log=False``).
    """
    check_confidence(confidence)
    x, y, dropped = _aligned(candidate, reference, log)
    d = x - y
    n = int(d.size)
    out = {"scale": "log" if log else "linear", "n": n, "n_dropped": dropped, "differences": [float(v) for v in d],
           **dict.fromkeys(("difference", "sd_diff", "t", "df", "p_value", "p_t", "p_exact", "p_exact_se",
                            "smallest_p", "test", "diff_ci_low", "diff_ci_high", "boot_ci_low", "boot_ci_high",
                            "relative", "relative_ci_low", "relative_ci_high")),
           "confidence": confidence}
    if n:
        out["difference"] = float(d.mean())
    if n >= 2:
        out.update(_paired_test(x, y, confidence))
        out["boot_ci_low"], out["boot_ci_high"] = _bootstrap_interval(
            d, confidence, bootstrap_resamples, bootstrap_method, seed)
    if log:
        for key, value in (("relative", "difference"), ("relative_ci_low", "diff_ci_low"),
                           ("relative_ci_high", "diff_ci_high")):
            out[key] = None if out[value] is None else math.expm1(out[value])
    return out


def tost(candidate: Sequence, reference: Sequence | None = None, *, margin: float, log: bool = True,
         alpha: float = 0.05) -> dict:
    """The paired equivalence test (two one-sided tests) against ``±margin_bound(margin, log)``.

    ``candidate`` and ``reference`` are per-seed values aligned by seed, paired like ``paired``;
    with ``reference=None``, ``candidate`` is the per-seed differences themselves, already on the
    scale ``log`` names (``paired(...)["differences"]``). The t-test's sides: ``ttest_rel(x + bound, y,
    alternative="greater")`` and ``ttest_rel(x - bound, y, alternative="less")``, ``p_value`` the larger
    (statsmodels' ``ttost_paired`` to 3e-15); the interval is the ``1 - 2 alpha`` t interval of the mean
    difference: the t TOST is equivalent at ``alpha`` exactly when it lies inside ``±bound``. Fewer
    than two pairs: p-values None, ``equivalent`` None.

    The exact counterpart stands beside it (``sign_flip_tost``: ``p_exact``), and the verdict rule
    picks the test as for the difference (``exact_decides``: the exact one below ``EXACT_BELOW``
    pairs or with a degenerate spread): ``test`` names it, ``p_lower``/``p_upper``/``p_value`` and
    ``equivalent`` are its; ``p_t`` is the t-test's (None with a degenerate spread).
    """
    check_alpha(alpha)
    bound = margin_bound(margin, log)
    if reference is None:
        x = _clean(candidate)
        y = np.zeros_like(x)
    else:
        x, y, _ = _aligned(candidate, reference, log)
    d = x - y
    n = int(d.size)
    out = {"n": n, "margin": float(margin), "bound": bound, "p_lower": None, "p_upper": None,
           "p_value": None, "p_t": None, "p_exact": None, "test": None, "ci_low": None, "ci_high": None,
           "alpha": alpha, "equivalent": None}
    if n < 2:
        return out
    mean = float(d.mean())
    exact = sign_flip_tost(d, bound)
    t_sides = None
    if degenerate_spread(d):
        low = high = mean
    else:
        with warnings.catch_warnings():  # scipy warns about nearly identical data; the numbers stand
            warnings.simplefilter("ignore", RuntimeWarning)
            t_sides = (float(_st.ttest_rel(x + bound, y, alternative="greater").pvalue),
                       float(_st.ttest_rel(x - bound, y, alternative="less").pvalue))
        low, high = _st.t.interval(1.0 - 2.0 * alpha, n - 1, loc=mean, scale=d.std(ddof=1) / math.sqrt(n))
    decides = exact_decides(n, d)
    p_lower, p_upper = (exact["p_lower"], exact["p_upper"]) if decides else t_sides
    p = max(p_lower, p_upper)
    out.update(p_lower=p_lower, p_upper=p_upper, p_value=p, p_t=None if t_sides is None else max(t_sides),
               p_exact=exact["p_value"], test=EXACT_TEST if decides else T_TEST, ci_low=float(low),
               ci_high=float(high), equivalent=p < alpha)
    return out


def paired_verdict(result: dict, margin: float, alpha: float = 0.05, p_adjusted: float | None = None, *,
                   lower_is_better: bool = True, power: float = 0.8, max_seeds: int | None = 1000,
                   p_tost_adjusted: float | None = None, family_size: int = 1) -> dict:
    """One of ``better``, ``worse``, ``equivalent``, ``undetermined`` for a ``paired`` result, by
    ``PAIRED_RULE``, with the numbers.

    ``p_adjusted`` replaces the result's p-value (Holm across the family: ``holm_family``);
    ``p_tost_adjusted`` likewise replaces the equivalence test's p-value, which is otherwise used
    as it is (one equivalence claim per comparison). ``margin`` follows ``margin_bound`` on the
    result's scale. ``family_size``: the comparisons Holm's correction covers (``cannot_decide``).

    The result's numbers come back beside the verdict. ``label`` is the verdict with the margin
    ('equivalent within ±1%'); ``text`` adds the numbers. ``seeds_to_decide`` is the advice for an
    undetermined verdict: where the observed difference lies at or beyond a bound, the seeds for the
    rule's two-sided test to detect that difference (Holm's level, the sd's bound), else
    ``seeds_for_equivalence``. The planning numbers, at the observed sd of the differences and
    ``power`` (None with fewer than two pairs):

    - ``mde``: the smallest true mean difference (either sign, on the differences' scale) that a
      two-sided paired t-test at Holm's level ``alpha / family_size`` would detect with ``power``
      at these seeds (``minimal_detectable_effect``; None when the exact test that decides at this
      n cannot pass that level at all); ``mde_relative = exp(mde) - 1`` on the log scale;
    - ``seeds_for_equivalence``: paired seeds for the rule's equivalence test to conclude with
      ``power`` if the true difference were 0, ``seeds_for_margin``: for its two-sided test to
      detect a true difference of one bound; both by ``seed_plan``: at Holm's level of the
      family, under the verdict rule, at the 80% upper confidence bound of the observed sd, with
      ``*_range`` = [n at the observed sd, n at its bound] and ``seed_plan`` the plan in words;

    both None when more than ``max_seeds`` would be needed (the text says 'more than max_seeds').
    """
    check_alpha(alpha)
    _check_power(power)
    log = result["scale"] == "log"
    bound = margin_bound(margin, log)
    diff, n, sd = result["difference"], result["n"], result["sd_diff"]
    p = result["p_value"] if p_adjusted is None else p_adjusted
    p_tost = tost(result["differences"], margin=margin, log=log, alpha=alpha)["p_value"] \
        if p_tost_adjusted is None else p_tost_adjusted
    if p is not None and diff is not None and p < alpha and diff != 0.0:
        word = PAIRED_BETTER if (diff < 0) == lower_is_better else PAIRED_WORSE
    elif p_tost is not None and p_tost < alpha:
        word = EQUIVALENT
    else:
        word = UNDETERMINED
    plan = dict.fromkeys(VERDICT_KEYS[1:])  # the planning numbers, None with fewer than two pairs
    if n >= 2 and sd is not None:
        m = _family(family_size)
        # these seeds detect nothing when the exact test's smallest p cannot pass Holm's first step
        mde = None if result.get("test") == EXACT_TEST and m * smallest_p(n) >= alpha \
            else minimal_detectable_effect(n, sd, power, alpha / m)
        plan_for = functools.partial(seed_plan, sd, n, power=power, alpha=alpha, family_size=m, max_seeds=max_seeds)
        equivalence, margin_plan = plan_for(bound, equivalence=True), plan_for(bound)
        # a large difference: seeds to show it, not equivalence
        decide = plan_for(abs(diff)) if diff is not None and abs(diff) >= bound else equivalence
        plan = {"mde": mde, "mde_relative": None if mde is None or not log else math.expm1(mde),
                "seeds_for_equivalence": equivalence["seeds"], "seeds_for_margin": margin_plan["seeds"],
                "seeds_for_equivalence_range": [equivalence["n_point"], equivalence["n_upper"]],
                "seeds_for_margin_range": [margin_plan["n_point"], margin_plan["n_upper"]],
                "seed_plan": equivalence["text"], "seeds_to_decide": decide["seeds"],
                "seeds_to_decide_range": [decide["n_point"], decide["n_upper"]]}
    out = {"verdict": word, "label": f"{EQUIVALENT} within {_margin_text(margin, log)}" if word == EQUIVALENT else word,
           "difference": diff, **{k: result[k] for k in ("diff_ci_low", "diff_ci_high", "relative",
                                                       "relative_ci_low", "relative_ci_high")},
           "n": n, "sd_diff": sd, "alpha": alpha, "p_value": p, "p_adjusted": p_adjusted is not None,
           "p_t": result.get("p_t"), "p_exact": result.get("p_exact"), "test": result.get("test"),
           "cannot_decide": cannot_decide(n, alpha, family_size,
                                          exact=None if result.get("test") is None else result["test"] == EXACT_TEST),
           "p_tost": p_tost, "margin": float(margin), "bound": bound, "power": power, **plan,
           "max_seeds": max_seeds}
    out["text"] = _verdict_text(out, result.get("confidence", 0.95), log)
    return out


def paired_interaction(diffs_a: Sequence | Mapping, diffs_b: Sequence | Mapping, confidence: float = 0.95, *,
                       shared_seeds: bool = True) -> dict:
    """Whether a gene's per-seed advantage (``paired(...)["differences"]``) changes from size a to
    size b: ``change = mean(diffs_b) - mean(diffs_a)`` (on the differences' scale; for a
    lower-is-better metric a positive change means the advantage shrinks or turns into a loss).

    Seeds decide the test (``test``: paired or welch): given two mappings ``{seed: difference}``, a
    paired test of the per-seed ``b - a`` when the seeds with a finite value are the same at both
    sizes, Welch's test otherwise; two sequences are aligned by seed position (paired, failed pairs
    dropped, lengths must match) unless ``shared_seeds=False`` (Welch). Two-sided; None where fewer
    than two values allow no test; a paired ``p_value`` is that of ``paired``'s verdict rule, ``p_t``
    the t-test's (Welch's: the same).
    """
    check_confidence(confidence)
    if isinstance(diffs_a, Mapping) != isinstance(diffs_b, Mapping):
        raise UserError("paired_interaction needs two mappings {seed: difference} or two sequences, not one of each")
    if isinstance(diffs_a, Mapping):
        seeds_a = {k for k, v in diffs_a.items() if _seed_value(v) is not None}
        seeds_b = {k for k, v in diffs_b.items() if _seed_value(v) is not None}
        shared_seeds = seeds_a == seeds_b
        order = sorted(seeds_a, key=repr)
        a = [diffs_a[k] for k in order] if shared_seeds else list(diffs_a.values())
        b = [diffs_b[k] for k in order] if shared_seeds else list(diffs_b.values())
    else:
        a, b = list(diffs_a), list(diffs_b)
    if shared_seeds:
        r = paired(b, a, confidence, log=False, bootstrap_resamples=0)
        return {"test": "paired", "n_a": r["n"], "n_b": r["n"], "change": r["difference"],
                "ci_low": r["diff_ci_low"], "ci_high": r["diff_ci_high"], "t": r["t"], "df": r["df"],
                "p_value": r["p_value"], "p_t": r["p_t"], "confidence": confidence}
    w = welch(b, a, confidence)
    return {"test": "welch", "n_a": int(_clean(a).size), "n_b": int(_clean(b).size),
            "change": w["difference"], "ci_low": w["diff_ci_low"], "ci_high": w["diff_ci_high"],
            "t": w["t"], "df": w["df"], "p_value": w["p_value"], "p_t": w["p_value"], "confidence": confidence}


def two_factor_shares(neither: Sequence, first: Sequence, second: Sequence, both: Sequence,
                      confidence: float = 0.95, *, log: bool = True, lower_is_better: bool = True) -> dict:
    """How much of the advantage of ``both`` over ``neither`` each of two factors carries, from the
    four cells of a 2x2 trained on the same seeds (per-seed values aligned by seed: ``first`` has
    only the first factor, ``second`` only the second). A seed where any cell failed is dropped; a
    value <= 0 on the log scale is a UserError, as in ``paired``.

    Per seed, on the log scale with ``log`` (else plain) and signed so that positive is better:
    the first factor's gain ``alone`` (over neither) and ``with`` the second (``both`` over
    ``second``), likewise for the second; a factor's ``share`` is the mean of its two gains, so the
    shares add up to the advantage (``total``) seed by seed. Each of ``total``, ``first`` and
    ``second`` is ``{"mean", "ci_low", "ci_high", "p_value", "relative", "relative_ci_low",
    "relative_ci_high", "fraction", "alone", "with"}`` (the per-seed values against 0: the t
    interval, and the p of the test ``paired``'s verdict rule picks, the exact sign-flip test below
    ``EXACT_BELOW`` seeds, the one-sample t-test from there; ``relative``: the improvement as a
    fraction of the reference, ``1 - exp(-x)`` when lower is better, ``exp(x) - 1`` when higher is,
    on the log scale only; ``fraction``: the share over the mean advantage, when that is positive;
    ``alone``/``with``: the means of the two gains). ``interaction``: ``paired_interaction`` (the
    same rule) of the first factor's gain alone and with the second (``change > 0``: the two
    factors reinforce each other), with the same numbers seen from the second factor. Returns also
    ``scale``, ``n`` and ``n_dropped``."""
    check_confidence(confidence)
    cells = [list(neither), list(first), list(second), list(both)]
    if len({len(c) for c in cells}) != 1:
        raise UserError("the four cells of a 2x2 need one value per seed each (use None for a failed seed)")
    rows = [values for values in ([_seed_value(v) for v in seed] for seed in zip(*cells)) if None not in values]
    sign = -1.0 if lower_is_better else 1.0  # gains: positive = better
    y = np.asarray(rows, dtype=float).reshape(-1, 4)
    y = _logged(y) if log else y
    # each factor's gains: alone (over neither) and with the other factor
    first_gains = (sign * (y[:, 1] - y[:, 0]), sign * (y[:, 3] - y[:, 2]))
    second_gains = (sign * (y[:, 2] - y[:, 0]), sign * (y[:, 3] - y[:, 1]))

    def summary(per_seed: np.ndarray, gains=None) -> dict:
        r = paired(per_seed, np.zeros_like(per_seed), confidence, log=False, bootstrap_resamples=0)
        out = {"mean": r["difference"], "ci_low": r["diff_ci_low"], "ci_high": r["diff_ci_high"],
               "p_value": r["p_value"]}
        for key, value in (("relative", "mean"), ("relative_ci_low", "ci_low"), ("relative_ci_high", "ci_high")):
            x = out[value]
            out[key] = None if not log or x is None else (-math.expm1(-x) if lower_is_better else math.expm1(x))
        if gains is not None:  # both gains have a value per seed
            out["alone"], out["with"] = (float(gains[0].mean()), float(gains[1].mean())) if y.size else (None, None)
        return out

    out = {"scale": "log" if log else "linear", "n": int(y.shape[0]), "n_dropped": len(cells[0]) - int(y.shape[0]),
           "total": summary(sign * (y[:, 3] - y[:, 0])),
           "first": summary((first_gains[0] + first_gains[1]) / 2, first_gains),
           "second": summary((second_gains[0] + second_gains[1]) / 2, second_gains)}
    advantage = out["total"]["mean"]
    positive = advantage is not None and advantage > 0
    for name in ("first", "second"):
        share = out[name]["mean"]
        out[name]["fraction"] = share / advantage if positive and share is not None else None
    out["total"]["fraction"] = 1.0 if positive else None
    out["interaction"] = paired_interaction(list(first_gains[0]), list(first_gains[1]), confidence)
    return out


# ---------------------------------------------------------------------------------------------
# the exact paired sign-flip test (small samples, degenerate spreads)


def degenerate_spread(differences: Sequence) -> bool:
    """Whether the spread of ``differences`` is zero or rounding noise (at most
    ``DEGENERATE_SPREAD`` of their largest magnitude): the t statistic then divides by noise and
    its p-value means nothing, so the exact test decides. Fewer than two values: False."""
    d = _clean(differences)
    if d.size < 2:
        return False
    return float(np.ptp(d)) <= DEGENERATE_SPREAD * float(np.max(np.abs(d)))


def _sign_patterns(n: int) -> np.ndarray:
    """All 2^n patterns of n signs, as a (2^n, n) array of ±1."""
    codes = np.arange(2 ** n, dtype=np.int64)[:, None]
    return 1.0 - 2.0 * ((codes >> np.arange(n, dtype=np.int64)) & 1)


def _count_as_extreme(sums: np.ndarray, observed: float, alternative: str, tolerance: float) -> np.ndarray:
    """Per row of ``sums`` (the statistic under sign patterns, last axis), how many are at least as
    extreme as ``observed``; ``tolerance`` counts sums equal up to rounding as ties (discrete
    metrics make exact ties common)."""
    if alternative == "two-sided":
        hit = np.abs(sums) >= abs(observed) - tolerance
    elif alternative == "greater":
        hit = sums >= observed - tolerance
    else:
        hit = sums <= observed + tolerance
    return hit.sum(axis=-1)


def sign_flip(differences: Sequence, alternative: str = "two-sided", *, resamples: int = SIGN_FLIP_RESAMPLES,
              seed: int = 0) -> dict:
    """The exact paired sign-flip permutation test of ``H0: the differences are symmetric about 0``.

    The statistic is the sum of the differences (the mean, times n). Under H0 each difference's
    sign is as likely as its opposite, so the statistic's null law is that of every one of the 2^n
    sign patterns; the p-value is the fraction of patterns whose sum is at least as extreme as the
    observed one (the observed pattern among them; sums equal to 1e-9 of ``sum |d|`` tie).
    ``alternative``: 'two-sided' (``|sum|``), 'greater' or 'less'.

    Up to ``EXACT_MAX`` differences every pattern is enumerated (``exact`` True, ``se`` 0). Beyond,
    ``resamples`` random patterns from ``numpy.random.default_rng(seed)`` give the Monte Carlo p
    ``(hits + 1) / (resamples + 1)`` (never 0) with its binomial standard error ``se``.

    With no finite difference the p-value is None; ``smallest_p`` is the least p this n can give.

    Not ``scipy.stats.permutation_test((d,), sum, permutation_type="samples")``: its ties are sums
    within ``100 eps |observed|``, a tolerance that vanishes when the observed sum is about 0 (after
    the TOST's shift, or with a discrete metric's ties: on ``[0.1, 0.2, 0.3, -0.6]`` its 'greater'
    p is 0.5, not 0.5625); its two-sided p is twice the smaller one-sided p, not the count of
    ``|sum|`` at least ``|observed|``; it refuses one difference; its Monte Carlo draws differ.
    """
    if alternative not in ("two-sided", "greater", "less"):
        raise UserError(f"alternative {alternative!r} is not one of two-sided, greater, less")
    d = _clean(differences)
    n = int(d.size)
    out = {"n": n, "p_value": None, "exact": True, "patterns": 0, "se": None,
           "smallest_p": smallest_p(n, alternative) if n else None, "alternative": alternative}
    if n == 0:
        return out
    observed = float(d.sum())
    tolerance = 1e-9 * float(np.abs(d).sum())
    if n <= EXACT_MAX:
        sums = _sign_patterns(n) @ d
        hits = int(_count_as_extreme(sums, observed, alternative, tolerance))
        out.update(p_value=hits / sums.size, patterns=int(sums.size), se=0.0)
        return out
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise UserError(f"resamples must be a positive integer, got {resamples!r}")
    rng = np.random.default_rng(seed)
    hits, left = 0, resamples
    while left:  # in chunks: memory stays at most 2^16 patterns of n signs
        chunk = min(left, 2 ** 16)
        signs = rng.integers(0, 2, size=(chunk, n)) * 2.0 - 1.0
        hits += int(_count_as_extreme(signs @ d, observed, alternative, tolerance))
        left -= chunk
    p = (hits + 1) / (resamples + 1)
    out.update(p_value=p, exact=False, patterns=resamples, se=math.sqrt(p * (1.0 - p) / resamples))
    return out


def sign_flip_tost(differences: Sequence, bound: float, **kwargs) -> dict:
    """The exact equivalence test against ``±bound``: two one-sided sign-flip tests, ``H0: mean <=
    -bound`` on ``d + bound`` ('greater') and ``H0: mean >= +bound`` on ``d - bound`` ('less');
    ``p_value`` is the larger. ``kwargs`` go to ``sign_flip``. Returns ``{"n", "p_lower",
    "p_upper", "p_value", "exact", "smallest_p"}`` (p-values None without a difference)."""
    d = _clean(differences)
    lower = sign_flip(d + bound, "greater", **kwargs)
    upper = sign_flip(d - bound, "less", **kwargs)
    p = None if lower["p_value"] is None else max(lower["p_value"], upper["p_value"])
    return {"n": int(d.size), "p_lower": lower["p_value"], "p_upper": upper["p_value"], "p_value": p,
            "exact": lower["exact"], "smallest_p": lower["smallest_p"]}


def smallest_p(n: int, alternative: str = "two-sided") -> float:
    """The least p-value the exact sign-flip test can give on ``n`` differences: the observed
    pattern alone (one-sided, ``2^-n``) or with its mirror image (two-sided, ``2^(1-n)``), reached
    when every difference has the same sign (3 seeds: 0.25 two-sided, 0.125 one-sided)."""
    if n < 1:
        return 1.0
    return min(1.0, 2.0 ** (1 - n) if alternative == "two-sided" else 2.0 ** (-n))


def decisive_seeds(family_size: int = 1, alpha: float = 0.05) -> int:
    """The fewest paired seeds at which the verdict rule can show a difference at all after Holm over
    ``family_size`` comparisons: where the exact test's smallest two-sided p, times the family's size, is below
    ``alpha`` (6 for one comparison, 7 for three, at alpha 0.05), at most ``EXACT_BELOW``, where the t-test
    decides and its p has no floor (``cannot_decide`` is None from there)."""
    check_alpha(alpha)
    return min(EXACT_BELOW, _exact_seeds(alpha / _family(family_size)))


def _exact_seeds(alpha: float, alternative: str = "two-sided") -> int:
    """The fewest pairs (>= 2) whose exact test's smallest p is below ``alpha``: what decides a degenerate spread
    at any n. Any alpha > 0: ``smallest_p`` reaches 0."""
    return next(n for n in itertools.count(2) if smallest_p(n, alternative) < alpha)


def exact_decides(n: int, differences: Sequence | None = None) -> bool:
    """The verdict rule's choice of test: the exact sign-flip test decides below ``EXACT_BELOW``
    pairs, and at any n when the spread is degenerate (``degenerate_spread``); else the t-test."""
    return n < EXACT_BELOW or (differences is not None and degenerate_spread(differences))


def cannot_decide(n: int, alpha: float = 0.05, family_size: int = 1, *, exact: bool | None = None) -> str | None:
    """One line when ``n`` pairs cannot reach ``alpha`` with the exact test (the test the verdict
    rule uses below ``EXACT_BELOW`` pairs; ``exact`` overrides that choice), Holm-adjusted over
    ``family_size`` comparisons (its first step multiplies the smallest p by the family's size);
    None when they can. It names what cannot be shown: a difference (two-sided smallest p), or
    also equivalence ('cannot decide': the one-sided smallest p, half the two-sided one, fails too)."""
    check_alpha(alpha)
    m = _family(family_size)
    two = smallest_p(n, "two-sided")
    if n < 1 or not (n < EXACT_BELOW if exact is None else exact) or min(1.0, m * two) < alpha:
        return None
    what = "decide" if min(1.0, m * smallest_p(n, "greater")) >= alpha else "show a difference"
    return f"{n} seed{'s' if n != 1 else ''} cannot {what}: the smallest possible p is {two:.3g}{_holm_note(two, m)}"


def _holm_note(p: float, m: int) -> str:
    """`` (p after Holm over m comparisons)`` for a family of m > 1, else nothing."""
    return f" ({min(1.0, m * p):.3g} after Holm over {m} comparisons)" if m > 1 else ""


# ---------------------------------------------------------------------------------------------
# power and planning (on the scale of the differences: log differences for perplexity)


def power_paired(n: int, sd_diff: float, effect: float, alpha: float = 0.05, two_sided: bool = True) -> float:
    """The exact power of a paired t-test on ``n`` pairs against a true mean difference ``effect``
    when the differences have standard deviation ``sd_diff``: the noncentral t's mass beyond the
    critical values (both tails when ``two_sided``; one-sided tests look in the effect's
    direction). Fewer than two pairs allow no test: 0. Without spread the test is decided exactly:
    1 for a nonzero effect, 0 for none."""
    _check_inputs(sd_diff, alpha=alpha, effect=effect)
    if n < 2:
        return 0.0
    if sd_diff == 0.0:
        return 1.0 if effect != 0.0 else 0.0
    df = n - 1
    ncp = abs(effect) * math.sqrt(n) / sd_diff
    # isf, not ppf(1 - alpha / 2): below alpha ~1e-16 that rounds to 1.0, an infinite critical t
    critical = _st.t.isf(alpha / 2.0 if two_sided else alpha, df)
    # T = (Z + ncp) / S stays below the critical t only if S > ncp / (2 critical) or Z <= -ncp / 2: the miss
    # is at most those two tails, and at most 2^-54 (half an ulp below 1) the exact power rounds to 1.0
    # (as scipy's does there). scipy's nct.sf is NaN from a noncentrality of ~2e9 (a near-degenerate
    # pilot's), inside this rule except for 2 pairs at alpha < 1e-9
    if _sc.chdtrc(df, df * (ncp / (2.0 * critical)) ** 2) + _sc.ndtr(-ncp / 2.0) <= 2.0 ** -54:
        return 1.0
    # the lower tail as the upper tail of the mirrored law: scipy's nct.cdf far in the left tail
    # can return NaN, its sf at -ncp is stable (statsmodels' ttest_power takes the cdf: not used)
    power = float(_st.nct.sf(critical, df, ncp) + (_st.nct.sf(critical, df, -ncp) if two_sided else 0.0))
    if math.isnan(power):
        raise UserError(f"the power of a paired t-test on {n} pairs at alpha {alpha:g} has no reliable value at "
                        f"a noncentrality of {ncp:.3g} (scipy's noncentral t fails there)", setting="alpha")
    return power


def seeds_for_effect(sd_diff: float, effect: float, power: float = 0.8, alpha: float = 0.05,
                     two_sided: bool = True, max_seeds: int | None = None) -> int | None:
    """The smallest number of paired seeds (>= 2) whose paired t-test has at least ``power``
    against a true mean difference ``effect`` (``power_paired``, exact). None when more than
    ``max_seeds`` (default ``SEEDS_CEILING``) would be needed, or for ``effect`` 0."""
    _check_inputs(sd_diff, power=power)
    if effect == 0.0:
        return None
    return _smallest_n(lambda n: power_paired(n, sd_diff, effect, alpha, two_sided), power, max_seeds)


def minimal_detectable_effect(n: int, sd_diff: float, power: float = 0.8, alpha: float = 0.05,
                              two_sided: bool = True) -> float | None:
    """The true mean difference (positive; the test is symmetric) that a paired t-test on ``n``
    pairs detects with exactly ``power``: the root of ``power_paired(n, sd_diff, effect) =
    power`` (``scipy.optimize.brentq``). None for fewer than two pairs; 0 without spread."""
    _check_inputs(sd_diff, power=power)
    check_alpha(alpha)
    if n < 2:
        return None
    if sd_diff == 0.0:
        return 0.0
    if power <= alpha:  # a test at alpha has power alpha already without any effect
        return 0.0
    gap = lambda effect: power_paired(n, sd_diff, effect, alpha, two_sided) - power  # noqa: E731
    high = sd_diff
    while gap(high) < 0.0:
        high *= 2.0
    return float(_optimize.brentq(gap, 0.0, high, xtol=1e-13 * sd_diff, rtol=4 * np.finfo(float).eps, maxiter=500))


def power_tost(n: int, sd_diff: float, bound: float, alpha: float = 0.05, true_difference: float = 0.0) -> float:
    """The exact power of ``tost`` on ``n`` pairs (both one-sided tests at ``alpha`` against
    ``±bound``) when the true mean difference is ``true_difference``.

    Given the sample sd s, both tests reject when the mean lies within ``±(bound - t_c s /
    sqrt(n))`` (``t_c`` the one-sided critical t); the mean is normal and independent of s, whose
    ``(n - 1) s^2 / sd^2`` is chi-square with n - 1 degrees of freedom. The power is that normal
    probability integrated over the chi-square quantiles for which the window is not empty.
    """
    _check_inputs(sd_diff, alpha=alpha, bound=bound, true_difference=true_difference)
    if n < 2:
        return 0.0
    if sd_diff == 0.0:
        return 1.0 if abs(true_difference) < bound else 0.0
    df = n - 1
    critical = _st.t.isf(alpha, df)
    se = sd_diff / math.sqrt(n)
    widest = df * (bound / (critical * se)) ** 2  # chi-square value at which the window closes
    q_max = float(_st.chi2.cdf(widest, df))

    # the special functions behind chi2.ppf and norm.cdf, bitwise theirs: the wrappers cost 100x per point
    def inside(q: float) -> float:
        half = bound - critical * se * math.sqrt(2.0 * _sc.gammaincinv(df / 2, q) / df)
        if half <= 0.0:
            return 0.0
        return float(_sc.ndtr((half - true_difference) / se) - _sc.ndtr((-half - true_difference) / se))

    with warnings.catch_warnings():  # quad reports roundoff when it nears 1e-9; the value holds to that
        warnings.simplefilter("ignore", _integrate.IntegrationWarning)
        value, _ = _integrate.quad(inside, 0.0, q_max, epsabs=1e-9, epsrel=1e-9, limit=200)
    return min(1.0, max(0.0, float(value)))


def seeds_for_equivalence(sd_diff: float, bound: float, power: float = 0.8, alpha: float = 0.05,
                          true_difference: float = 0.0, max_seeds: int | None = None) -> int | None:
    """The smallest number of paired seeds (>= 2) for ``tost`` against ``±bound`` to conclude
    equivalence with at least ``power`` when the true difference is ``true_difference``
    (``power_tost``). None when more than ``max_seeds`` (default ``SEEDS_CEILING``) would be
    needed, which is always the case when ``|true_difference| >= bound``."""
    _check_inputs(sd_diff, power=power, bound=bound, true_difference=true_difference)
    _check_bound(bound)
    if abs(true_difference) >= bound:
        return None
    return _smallest_n(lambda n: power_tost(n, sd_diff, bound, alpha, true_difference), power, max_seeds)


# -- planning under the verdict rule: the exact test below EXACT_BELOW pairs, Holm's level, the
# -- pilot's spread taken at an upper confidence bound

def sd_upper_bound(sd: float, n: int, level: float = SD_BOUND_LEVEL) -> float:
    """The one-sided ``level`` upper confidence bound of a standard deviation ``sd`` estimated from
    ``n`` values: ``sd * sqrt((n - 1) / chi2.ppf(1 - level, n - 1))`` (the sample variance times
    ``(n - 1) / sigma^2`` is chi-square with n - 1 degrees of freedom for normal values). With 3
    pilot values the 80% bound is 2.1x the estimate."""
    _check_inputs(sd)
    if n < 2:
        raise UserError(f"an upper bound of the sd needs at least 2 values, got {n}")
    return float(sd * math.sqrt((n - 1) / _st.chi2.ppf(1.0 - level, n - 1)))


@functools.lru_cache(maxsize=4096)
def _exact_power(n: int, ratio: float, alpha: float, bound_ratio: float | None) -> float:
    """The simulated power of the exact sign-flip test on ``n`` normal differences of sd 1 and mean
    ``ratio`` (the true mean over the sd): two-sided against 0, or with ``bound_ratio`` the exact
    equivalence test against ±that bound. ``EXACT_POWER_REPS`` draws from a fixed seed (standard
    error at most 0.011); a zero sd is handled by the caller."""
    if smallest_p(n, "two-sided" if bound_ratio is None else "greater") >= alpha:
        return 0.0
    rng = np.random.default_rng(20240)
    signs = _sign_patterns(n).T  # (n, 2^n)
    hits, left = 0, EXACT_POWER_REPS
    while left:
        chunk = min(left, 512)
        d = rng.normal(ratio, 1.0, size=(chunk, n))
        if bound_ratio is None:
            p = _row_sign_flip(d, "two-sided", signs)
        else:
            p = np.maximum(_row_sign_flip(d + bound_ratio, "greater", signs),
                           _row_sign_flip(d - bound_ratio, "less", signs))
        hits += int(np.sum(p < alpha))
        left -= chunk
    return hits / EXACT_POWER_REPS


def _row_sign_flip(d: np.ndarray, alternative: str, signs: np.ndarray) -> np.ndarray:
    """``sign_flip``'s exact p of each row of ``d`` (``signs``: the (n, 2^n) patterns)."""
    observed = d.sum(axis=1, keepdims=True)
    tolerance = 1e-9 * np.abs(d).sum(axis=1, keepdims=True)
    return _count_as_extreme(d @ signs, observed, alternative, tolerance) / signs.shape[1]


def verdict_power(n: int, sd_diff: float, effect: float, alpha: float = 0.05) -> float:
    """The power of the verdict rule's two-sided test on ``n`` pairs against a true mean difference
    ``effect``: the exact sign-flip test's (simulated, ``_exact_power``) below ``EXACT_BELOW`` pairs,
    the t-test's (``power_paired``, exact) from there. Without spread the exact test rejects a
    nonzero effect whenever its smallest p is below alpha."""
    _check_inputs(sd_diff, alpha=alpha, effect=effect)
    if n >= EXACT_BELOW:
        return power_paired(n, sd_diff, effect, alpha)
    if n < 1:
        return 0.0
    if sd_diff == 0.0:
        return float(effect != 0.0 and smallest_p(n) < alpha)
    return _exact_power(n, round(abs(effect) / sd_diff, 6), alpha, None)


def verdict_power_equivalence(n: int, sd_diff: float, bound: float, alpha: float = 0.05,
                              true_difference: float = 0.0) -> float:
    """The power of the verdict rule's equivalence test against ``±bound`` (exact sign-flip TOST
    below ``EXACT_BELOW`` pairs, simulated; the t TOST's ``power_tost`` from there)."""
    _check_inputs(sd_diff, alpha=alpha, bound=bound, true_difference=true_difference)
    if n >= EXACT_BELOW:
        return power_tost(n, sd_diff, bound, alpha, true_difference)
    if n < 1:
        return 0.0
    if sd_diff == 0.0:
        return float(abs(true_difference) < bound and smallest_p(n, "greater") < alpha)
    return _exact_power(n, round(abs(true_difference) / sd_diff, 6), alpha, round(bound / sd_diff, 6))


def _seeds_under_rule(t_seeds: int | None, power_at, power: float, max_seeds: int | None) -> int | None:
    """The smallest n whose rule-power reaches ``power``, given ``t_seeds``, the t-test's answer.
    For normal differences the t-test is the most powerful unbiased test, so the exact test needs
    at least as many: the search starts at ``t_seeds``; at and beyond ``EXACT_BELOW`` the t-test
    decides and its answer stands."""
    if t_seeds is None:
        return None
    cap = SEEDS_CEILING if max_seeds is None else int(max_seeds)
    for n in range(t_seeds, min(EXACT_BELOW, cap + 1)):
        if power_at(n) >= power:
            return n
    n = max(t_seeds, EXACT_BELOW)
    return n if n <= cap else None


def seeds_for_verdict(sd_diff: float, effect: float, power: float = 0.8, alpha: float = 0.05,
                      max_seeds: int | None = None) -> int | None:
    """The paired seeds for the verdict rule's two-sided test (``verdict_power``) to detect a true
    difference ``effect`` with ``power`` at ``alpha`` (pass Holm's level: ``seed_plan``). None when
    more than ``max_seeds`` would be needed, or for ``effect`` 0."""
    _check_inputs(sd_diff, power=power, effect=effect)
    if effect == 0.0:
        return None
    if sd_diff == 0.0:
        n = _exact_seeds(alpha)
        return n if max_seeds is None or n <= max_seeds else None
    t_seeds = seeds_for_effect(sd_diff, effect, power, alpha, max_seeds=max_seeds)
    return _seeds_under_rule(t_seeds, lambda n: verdict_power(n, sd_diff, effect, alpha), power, max_seeds)


def seeds_for_verdict_equivalence(sd_diff: float, bound: float, power: float = 0.8, alpha: float = 0.05,
                                  true_difference: float = 0.0, max_seeds: int | None = None) -> int | None:
    """The paired seeds for the verdict rule's equivalence test (``verdict_power_equivalence``) to
    conclude within ``±bound`` with ``power`` when the true difference is ``true_difference``."""
    _check_inputs(sd_diff, power=power, bound=bound, true_difference=true_difference)
    _check_bound(bound)
    if abs(true_difference) >= bound:
        return None
    if sd_diff == 0.0:
        n = _exact_seeds(alpha, "greater")
        return n if max_seeds is None or n <= max_seeds else None
    t_seeds = seeds_for_equivalence(sd_diff, bound, power, alpha, true_difference, max_seeds=max_seeds)
    return _seeds_under_rule(t_seeds, lambda n: verdict_power_equivalence(n, sd_diff, bound, alpha, true_difference),
                             power, max_seeds)


def seed_plan(sd_diff: float, pilot_n: int, effect: float, *, power: float = 0.8, alpha: float = 0.05,
              family_size: int = 1, equivalence: bool = False, level: float = SD_BOUND_LEVEL,
              max_seeds: int | None = None) -> dict:
    """How many paired seeds decide a comparison, planned honestly: at Holm's level of the family
    the run will test (``alpha / family_size``, Holm's first and strictest step: every member then
    has at least ``power``), under the verdict rule (exact test below ``EXACT_BELOW`` pairs), and
    over the uncertainty of the pilot's spread: ``n_point`` at the sd estimated from ``pilot_n``
    values, ``n_upper`` at its one-sided ``level`` upper confidence bound (``sd_upper_bound``).
    ``seeds`` (the plan) is ``n_upper``; None when more than ``max_seeds`` would be needed.

    ``effect``: the true difference to detect (two-sided), or with ``equivalence`` the bound to
    show equivalence within at a true difference of 0; ``text``: the plan in words."""
    check_alpha(alpha)
    m = _family(family_size)
    alpha_holm = alpha / m
    upper = sd_upper_bound(sd_diff, pilot_n, level)
    seeds = seeds_for_verdict_equivalence if equivalence else seeds_for_verdict
    n_point, n_upper = (seeds(sd, effect, power, alpha_holm, max_seeds=max_seeds) for sd in (sd_diff, upper))
    text = (f"{_range_text([n_point, n_upper], max_seeds)} paired seeds ({_seeds_text(n_point, max_seeds)} at the pilot's sd, "
            f"{_seeds_text(n_upper, max_seeds)} at its {percent(level)} upper bound) for "
            f"{percent(power)} power at Holm's level {alpha_holm:.3g} ({m} comparison{'s' if m != 1 else ''})")
    return {"seeds": n_upper, "n_point": n_point, "n_upper": n_upper, "sd": float(sd_diff), "sd_upper": upper,
            "level": level, "pilot_n": int(pilot_n), "alpha": alpha, "alpha_holm": alpha_holm, "family_size": m,
            "power": power, "equivalence": equivalence, "text": text}


# ---------------------------------------------------------------------------------------------
# solve rates: outcomes that are solved or not (a seed solves a task point or stays at the plateau)

SOLVED_MORE, SOLVED_LESS = "solves more often", "solves less often"
SOLVE_TESTS = ("fisher", "barnard")


def solve_rate(solved: int, n: int, confidence: float = 0.95) -> dict:
    """``{"solved", "n", "rate", "ci_low", "ci_high"}``: a count of solved seeds out of ``n`` with
    its exact (Clopper-Pearson) interval, ``scipy.stats.binomtest(...).proportion_ci(method='exact')``.
    With ``n`` 0 the rate and interval are None."""
    check_confidence(confidence)
    _check_counts(solved, n)
    if n == 0:
        return {"solved": 0, "n": 0, "rate": None, "ci_low": None, "ci_high": None}
    ci = _st.binomtest(int(solved), int(n)).proportion_ci(confidence_level=confidence, method="exact")
    return {"solved": int(solved), "n": int(n), "rate": solved / n, "ci_low": float(ci.low), "ci_high": float(ci.high)}


def solve_rate_test(a: tuple[int, int], b: tuple[int, int], test: str = "fisher") -> float:
    """The two-sided p-value that two solve rates ``(solved, n)`` are equal: Fisher's exact test
    (``scipy.stats.fisher_exact``, conditional on the total solved) or Barnard's
    (``scipy.stats.barnard_exact``, unconditional: more powerful, slower)."""
    if test not in SOLVE_TESTS:
        raise UserError(f"solve-rate test {test!r} is not one of {', '.join(SOLVE_TESTS)}")
    for counts in (a, b):
        _check_counts(*counts)
    table = [[a[0], a[1] - a[0]], [b[0], b[1] - b[0]]]
    if test == "fisher":
        return float(_st.fisher_exact(table).pvalue)
    if 0 in (a[1], b[1]) or (a[0] + b[0]) in (0, a[1] + b[1]):
        return 1.0  # one outcome only: nothing to compare (Barnard's statistic is undefined there)
    return float(_st.barnard_exact(table).pvalue)


def solve_rates_versus(counts: Mapping[_Key, tuple[int, int]],
                       reference: tuple[int, int] | Mapping[_Key, tuple[int, int]], *, alpha: float = 0.05,
                       test: str = "fisher", confidence: float = 0.95) -> dict[_Key, dict]:
    """Each ``(solved, n)`` of ``counts`` against the reference's (one for all, or by key: e.g. the
    reference gene at the same task point): both rates with exact intervals
    (``solve_rate``), the difference of rates, the two-sided p (``solve_rate_test``), Holm over the
    family (``family_size`` comparisons), and the verdict: ``solves more often`` / ``solves less
    often`` when the Holm p is below ``alpha``, else ``undetermined``; ``cannot_decide`` says in
    one line when these counts could not reach alpha whatever the outcomes (the most extreme
    table's p, Holm-adjusted, is not below it)."""
    check_alpha(alpha)
    refs = dict(reference) if isinstance(reference, Mapping) else {key: reference for key in counts}
    missing = [key for key in counts if key not in refs]
    if missing:
        raise UserError(f"the reference has no counts for {missing[0]!r}: give one (solved, n) for every key",
                        setting="reference")
    p = {key: solve_rate_test(c, refs[key], test) for key, c in counts.items()}
    p_holm = holm_family(p)
    m = len(p)
    out = {}
    for key, c in counts.items():
        reference = refs[key]
        ref = solve_rate(*reference, confidence=confidence)
        rate = solve_rate(*c, confidence=confidence)
        diff = None if rate["rate"] is None or ref["rate"] is None else rate["rate"] - ref["rate"]
        word = UNDETERMINED
        if p_holm[key] < alpha and diff:
            word = SOLVED_MORE if diff > 0 else SOLVED_LESS
        floor = solve_rate_test((c[1], c[1]), (0, reference[1]), test) if c[1] and reference[1] else 1.0
        note = None
        if min(1.0, m * floor) >= alpha:
            note = f"{c[1]} against {reference[1]} seeds cannot decide: the smallest possible p is {floor:.3g}" \
                   + _holm_note(floor, m)
        out[key] = {"rate": rate, "reference": ref, "difference": diff, "test": test, "p_value": p[key],
                    "p_holm": p_holm[key], "family_size": m, "verdict": word, "cannot_decide": note}
    return out


def _fisher_p_tables(n: int) -> np.ndarray:
    """Fisher's two-sided p of every table with ``n`` seeds per arm: ``[a, b]`` for a solved of
    the first arm's n and b of the second's. Given the total solved k, a is hypergeometric; the p
    sums the probabilities of the tables no likelier than the observed one (scipy's definition,
    with its relative tolerance 1 + 1e-7; one ``fisher_exact`` call per table is too slow for seed
    plans)."""
    out = np.ones((n + 1, n + 1))
    for k in range(2 * n + 1):
        a = np.arange(max(0, k - n), min(k, n) + 1)
        pmf = _st.hypergeom.pmf(a, 2 * n, k, n)
        p = np.array([pmf[pmf <= q * (1 + 1e-7)].sum() for q in pmf])
        out[a, k - a] = np.minimum(1.0, p)
    return out


def power_solve_rates(n: int, rate: float, reference_rate: float, alpha: float = 0.05) -> float:
    """The exact power of Fisher's two-sided test at ``alpha`` with ``n`` seeds per arm when the
    true solve rates are ``rate`` and ``reference_rate``: the probability, summed over every
    outcome table (binomial counts in each arm), of a table whose p is below alpha."""
    check_alpha(alpha)
    _check_rates(rate, reference_rate)
    if n < 1:
        return 0.0
    reject = _fisher_p_tables(n) < alpha
    k = np.arange(n + 1)
    weights = np.outer(_st.binom.pmf(k, n, rate), _st.binom.pmf(k, n, reference_rate))
    return float(min(1.0, weights[reject].sum()))


def seeds_for_solve_rates(rate: float, reference_rate: float, power: float = 0.8, alpha: float = 0.05,
                          family_size: int = 1, max_seeds: int = 200) -> int | None:
    """The seeds per arm for Fisher's test at Holm's level ``alpha / family_size`` to tell solve
    rates ``rate`` and ``reference_rate`` apart with ``power`` (``power_solve_rates``: exact, by
    enumeration; Barnard's test needs at most as many). The power of a discrete test is not
    monotone in n: this is the smallest n that reaches it. None beyond ``max_seeds`` or for equal
    rates."""
    _check_power(power)
    _check_rates(rate, reference_rate)
    if rate == reference_rate:
        return None
    level = alpha / _family(family_size)
    return next((n for n in range(1, int(max_seeds) + 1) if power_solve_rates(n, rate, reference_rate, level) >= power),
                None)


def _check_counts(solved, n) -> None:
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in (solved, n)) or not 0 <= solved <= n:
        raise UserError(f"a solve count needs integers 0 <= solved <= n, got {solved!r} of {n!r}")


def _check_rates(rate, reference_rate) -> None:
    for name, value in (("rate", rate), ("reference_rate", reference_rate)):
        if finite_or_none(value) is None or not 0.0 <= value <= 1.0:
            raise UserError(f"{name} {value!r} is not a solve rate in [0, 1]: use e.g. 0.5", setting=name)


def _family(family_size) -> int:
    """``family_size`` (the comparisons Holm's correction covers) as an int; not a count >= 1 is a UserError
    (a family of 0 is no family: it would be taken for 1)."""
    if isinstance(family_size, bool) or not isinstance(family_size, (int, np.integer)) or family_size < 1:
        raise UserError(f"family_size {family_size!r} must be a count of comparisons >= 1", setting="family_size")
    return int(family_size)


# ---------------------------------------------------------------------------------------------
# helpers of the paired comparisons


def _aligned(candidate: Sequence, reference: Sequence, log: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """The two sides of the pairs where both values are finite (logged with ``log``), and how many
    pairs were dropped. Unequal lengths, or a value <= 0 on the log scale, are a UserError: the
    pairing by seed, or the scale, would be wrong."""
    candidate, reference = list(candidate), list(reference)
    if len(candidate) != len(reference):
        raise UserError(f"paired values need one value per seed on each side: got {len(candidate)} "
                        f"and {len(reference)} (use None for a failed seed)")
    kept = [(a, b) for a, b in ((_seed_value(a), _seed_value(b)) for a, b in zip(candidate, reference))
            if a is not None and b is not None]
    x = np.asarray([a for a, _ in kept], dtype=float)
    y = np.asarray([b for _, b in kept], dtype=float)
    if log:
        x, y = _logged(x), _logged(y)
    return x, y, len(candidate) - len(kept)


def _logged(values: np.ndarray) -> np.ndarray:
    """``log(values)``; a value <= 0 is a UserError: the log scale is that of a ratio (perplexity)."""
    if np.any(values <= 0.0):
        raise UserError("the log scale needs positive values (perplexity); use log=False for this metric")
    return np.log(values)


def _paired_test(x: np.ndarray, y: np.ndarray, confidence: float) -> dict:
    """sd, t, df, p-value (``p_t``) and interval of the paired t-test of ``x - y`` (two pairs or
    more; no t without spread, ``degenerate_spread``), the exact sign-flip p beside it (``p_exact``,
    ``p_exact_se``: 0 when enumerated), and the verdict rule's ``test`` and ``p_value``."""
    d = x - y
    n = d.size
    exact = sign_flip(d)
    out = {"sd_diff": float(d.std(ddof=1)), "df": n - 1, "p_exact": exact["p_value"], "p_exact_se": exact["se"],
           "smallest_p": exact["smallest_p"]}
    if degenerate_spread(d):  # t would divide by rounding noise: no t, no t interval
        diff = float(d.mean())
        out.update(t=None, p_t=None, diff_ci_low=diff, diff_ci_high=diff)
    else:
        with warnings.catch_warnings():  # scipy warns about nearly identical data; the numbers stand
            warnings.simplefilter("ignore", RuntimeWarning)
            result = _st.ttest_rel(x, y)
            interval = result.confidence_interval(confidence_level=confidence)
        out.update(t=float(result.statistic), p_t=float(result.pvalue), diff_ci_low=float(interval.low),
                   diff_ci_high=float(interval.high))
    decides = exact_decides(n, d)
    out.update(test=EXACT_TEST if decides else T_TEST, p_value=out["p_exact"] if decides else out["p_t"])
    return out


def _bootstrap_interval(d: np.ndarray, confidence: float, resamples: int, method: str,
                        seed: int) -> tuple[float | None, float | None]:
    """The seeded bootstrap interval of the mean of ``d``; (None, None) with fewer than ``BOOTSTRAP_MIN`` values,
    no spread, no resamples, or a degenerate result (too few distinct resamples)."""
    if resamples <= 0 or d.size < BOOTSTRAP_MIN or np.ptp(d) == 0.0:
        return None, None
    with warnings.catch_warnings():  # small samples make scipy warn of degenerate resamples
        warnings.simplefilter("ignore")
        result = _st.bootstrap((d,), np.mean, n_resamples=int(resamples), confidence_level=confidence,
                               method=method, vectorized=True, rng=np.random.default_rng(seed))
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):
        return None, None
    return low, high


def _smallest_n(power_at, target: float, max_seeds: int | None) -> int | None:
    """The smallest n >= 2 with ``power_at(n) >= target`` for a power that grows with n: doubling
    until reached, then bisection. None beyond ``max_seeds`` (or ``SEEDS_CEILING``)."""
    cap = SEEDS_CEILING if max_seeds is None else int(max_seeds)
    if cap < 2:
        return None
    if power_at(2) >= target:
        return 2
    low, high = 2, 4  # power_at(low) < target throughout
    while high < cap and power_at(high) < target:
        low, high = high, high * 2
    if high >= cap:
        high = cap
        if power_at(high) < target:
            return None
    while high - low > 1:
        middle = (low + high) // 2
        if power_at(middle) >= target:
            high = middle
        else:
            low = middle
    return high


def _check_power(power: float) -> None:
    if not isinstance(power, (int, float)) or isinstance(power, bool) or not 0.0 < power < 1.0:
        raise UserError(f"power {power!r} is outside (0, 1): use e.g. 0.8")


_UNSET = object()


def _check_inputs(sd: float, *, power=_UNSET, alpha=_UNSET, **effects) -> None:
    """UserError for the first bad input of a power or seed calculation, in this order: ``power`` and
    ``alpha`` (where given), the sd of the differences (finite, >= 0), then each of ``effects`` (an effect,
    a bound: ``name=value``) that is not a finite number: a NaN compares false with every power and seed
    count, an infinite one has no noncentral t."""
    if power is not _UNSET:
        _check_power(power)
    if alpha is not _UNSET:
        check_alpha(alpha)
    if sd is None or not math.isfinite(sd) or sd < 0.0:
        raise UserError(f"the standard deviation of the differences must be finite and >= 0, not {sd!r}")
    for name, value in effects.items():
        if finite_or_none(value) is None:
            raise UserError(f"{name} {value!r} must be a finite number", setting=name)


def _check_bound(bound: float) -> None:
    if not bound > 0:
        raise UserError(f"bound {bound!r} must be positive: use margin_bound(margin, log)", setting="bound")


def _effect_text(value: float | None, log: bool) -> str:
    """A difference in words: a signed relative change on the log scale, metric units otherwise."""
    if value is None:
        return "n/a"
    return f"{100.0 * math.expm1(value):+.3g}%" if log else f"{value:+.4g}"


def _margin_text(margin: float, log: bool) -> str:
    return f"±{100.0 * margin:g}%" if log else f"±{margin:g}"


def _seeds_text(seeds: int | None, max_seeds: int | None) -> str:
    return str(seeds) if seeds is not None else f"more than {max_seeds or SEEDS_CEILING}"


def _range_text(span: Sequence | None, max_seeds: int | None) -> str:
    """[n at the point estimate, n at the bound] as '8' or '8..56'."""
    low, high = span if span else (None, None)
    if low == high:
        return _seeds_text(low, max_seeds)
    return f"{_seeds_text(low, max_seeds)}..{_seeds_text(high, max_seeds)}"


def _verdict_text(v: dict, confidence: float, log: bool) -> str:
    """``paired_verdict``'s sentence: the label, then the numbers it rests on."""
    if v["n"] < 2:
        return f"{v['label']}: fewer than 2 paired seeds ({v['n']})"
    p = "n/a" if v["p_value"] is None else f"{v['p_value']:.3g}"
    p_tost = "n/a" if v["p_tost"] is None else f"{v['p_tost']:.3g}"
    test = "exact sign-flip p" if v.get("test") == EXACT_TEST else "t-test p" if v.get("test") == T_TEST else "p"
    beside = ""
    if v.get("test") == EXACT_TEST:
        beside = " (t-test p " + ("n/a: no spread" if v.get("p_t") is None else f"{v['p_t']:.3g}") + ")"
    elif v.get("test") == T_TEST and v.get("p_exact") is not None:
        beside = f" (exact sign-flip p {v['p_exact']:.3g})"
    text = (f"{v['label']}: {_effect_text(v['difference'], log)} ({percent(confidence)} CI "
            f"{_effect_text(v['diff_ci_low'], log)} to {_effect_text(v['diff_ci_high'], log)}), "
            f"{test} = {p}{' (adjusted)' if v['p_adjusted'] else ''}{beside}, equivalence p = {p_tost} within "
            f"{_margin_text(v['margin'], log)}, {v['n']} paired seeds")
    # the interval printed is the t interval; where the exact test decides, the two may disagree
    low, high, bound = v["diff_ci_low"], v["diff_ci_high"], v.get("bound")
    if v.get("test") == EXACT_TEST and low is not None and high is not None and (
            (v["verdict"] in (PAIRED_BETTER, PAIRED_WORSE) and low <= 0 <= high)
            or (v["verdict"] == EQUIVALENT and bound is not None and not -bound < low <= high < bound)):
        text += ("; the t interval is not the deciding test's: the exact sign-flip test weighs each seed's sign, so "
                 "a far seed widens the interval, not the p")
    if v.get("cannot_decide"):
        text += f"; {v['cannot_decide']}"
    if v["verdict"] == UNDETERMINED and v["seed_plan"] is not None:
        margin = _margin_text(v["margin"], log)
        if v["mde"] is not None:
            mde = f"±{100.0 * v['mde_relative']:.3g}%" if log else f"±{v['mde']:.4g}"
            text += f"; with {percent(v['power'])} power these seeds detect {mde}"
        if abs(v["difference"]) >= v["bound"]:  # the data put the difference beyond a bound: seeds to show it
            plan = (f"{_range_text(v['seeds_to_decide_range'], v['max_seeds'])} paired seeds would detect the "
                    f"observed {_effect_text(v['difference'], log)}")
        else:  # planned at a true difference of 0: said so where the interval excludes 0
            plan = (f"{_range_text(v['seeds_for_equivalence_range'], v['max_seeds'])} paired seeds would show "
                    f"equivalence within {margin}" + ("" if low is None or high is None or low <= 0.0 <= high
                                                      else " if the true difference were 0"))
        text += (f"; {plan}, {_range_text(v['seeds_for_margin_range'], v['max_seeds'])} "
                 f"would detect a {margin} effect (at Holm's level, the sd at its "
                 f"{percent(SD_BOUND_LEVEL)} upper bound for the larger number)")
    return text


# -- a study's comparisons with its reference ---------------------------------------------------------
# The default equivalence margin: 1% of perplexity (bits per byte, bits per char), 0.01 nats of loss
# (the same thing to 0.5%: log 1.01 = 0.00995) or 0.01 of accuracy: the smallest effect the tool's own
# studies set out to resolve (docs/validation.md).
DEFAULT_MARGIN = 0.01
# metrics compared on the log scale: ratios, whose seed noise is about constant in relative terms
LOG_SCALE_METRICS = ("val_perplexity", "bits_per_byte", "bits_per_char")
# how a study's comparisons are computed; a result without this mark was made by an earlier rule
ANALYSIS = "paired-3"
# what a comparison's row carries of its ``paired_verdict`` besides the verdict and label: every key a
# table's verdict cell reads (report.studies.common.verdict_cell), so each copy of a row keeps them all
VERDICT_KEYS = ("cannot_decide", "mde", "mde_relative", "seeds_for_equivalence", "seeds_for_margin",
                "seeds_for_equivalence_range", "seeds_for_margin_range", "seeds_to_decide", "seeds_to_decide_range",
                "seed_plan")


def recompute_validation(result: Mapping, margin: float = DEFAULT_MARGIN) -> dict:
    """A validation-shaped result made by an earlier version (Welch, unpaired), with its gene rows'
    comparisons recomputed by ``versus_reference`` from the per-seed values it stores (aligned by
    its ``seeds``), Holm over its own genes; marked ``recomputed``. A current result is returned as
    it is."""
    if result.get("analysis") == ANALYSIS or not result.get("genes"):
        return dict(result)
    metric = result.get("metric", "val_perplexity")
    genes = [dict(g) for g in result.get("genes", [])]
    values = {g["gene"]: g.get("values") or [] for g in genes}
    reference = (result.get("baseline") or {}).get("values") or []
    if not reference or any(len(v) != len(reference) for v in values.values()):
        return dict(result)  # no per-seed values aligned by seed: nothing to pair
    compared = versus_reference(values, reference, confidence=result.get("confidence", 0.95),
                                log=metric in LOG_SCALE_METRICS, margin=margin,
                                lower_is_better=result.get("lower_is_better", True))
    rows = [{**g, **compared[g["gene"]]} for g in genes]
    return {**result, "genes": rows, "analysis": ANALYSIS, "recomputed": True, "margin": margin,
            "family_size": len(rows)}


def current_comparisons(result: Mapping, stored: Mapping[_Key, Mapping], values: Mapping[_Key, Sequence],
                        reference: Sequence, **rule) -> dict[_Key, dict]:
    """A result's ``stored`` comparison rows where it carries the current ``analysis`` mark; else each row
    with the numbers and verdict of ``versus_reference(values, reference, **rule)`` (``rule``: the result's
    own margin, scale, direction and Holm family), recomputed from the per-seed values it records."""
    if result.get("analysis") == ANALYSIS:
        return {k: dict(row) for k, row in stored.items()}
    return {k: {**stored[k], **row} for k, row in versus_reference(values, reference, **rule).items()}


def paired_test_name(log: bool) -> str:
    """How ``versus_reference`` compares, in words (what a result file says of its test)."""
    scale = "log values (relative changes)" if log else "values"
    return (f"paired test on per-seed differences of {scale}: {TEST_RULE}; bootstrap interval from "
            f"{BOOTSTRAP_MIN} seeds; Holm over the family of comparisons that share the reference trainings")


def versus_reference(values: Mapping[_Key, Sequence], reference: Sequence, *, confidence: float = 0.95,
                     log: bool = True, margin: float, lower_is_better: bool = True, power: float = 0.8,
                     others: Mapping[_Key, Mapping] | None = None, max_seeds: int | None = 1000) -> dict[_Key, dict]:
    """Each sample of ``values`` (per-seed values aligned with ``reference``'s seeds) against the
    reference: the ``paired`` numbers, the equivalence test at ``margin``, Welch's unpaired numbers
    beside them (``welch``: what the paired test replaces), Holm's correction of both the t-test's
    and the TOST's p-values over the family, and the ``paired_verdict`` with its planning numbers.

    The family is every sample here plus ``others`` (key -> ``{"values", "reference"}``: the other
    comparisons that share these reference trainings, e.g. earlier studies in the same store);
    ``family_size`` says how many comparisons the correction covers.
    """
    rows = {key: paired(v, reference, confidence, log=log) for key, v in values.items()}
    tests = {key: _family_test(row, margin, log, 1.0 - confidence) for key, row in rows.items()}
    for key, other in (others or {}).items():
        if key not in tests:
            tests[key] = _family_test(paired(other["values"], other["reference"], confidence, log=log,
                                             bootstrap_resamples=0), margin, log, 1.0 - confidence)
    p_holm = holm_family({k: t["p_value"] for k, t in tests.items()})
    p_tost_holm = holm_family({k: t["p_tost"] for k, t in tests.items()})
    base = _clean(reference)
    scale = 100.0 / float(base.mean()) if base.size and base.mean() != 0 else None  # units -> % of the reference
    out = {}
    for key, row in rows.items():
        v = paired_verdict(row, margin, 1.0 - confidence, p_adjusted=p_holm[key], p_tost_adjusted=p_tost_holm[key],
                           lower_is_better=lower_is_better, power=power, max_seeds=max_seeds,
                           family_size=len(tests))
        w = welch(values[key], reference, confidence)
        out[key] = {
            "scale": row["scale"], "n_pairs": row["n"],
            **{k: row[k] for k in ("difference", "sd_diff", "diff_ci_low", "diff_ci_high", "boot_ci_low",
                                   "boot_ci_high", "relative", "relative_ci_low", "relative_ci_high", "p_value")},
            "p_holm": p_holm[key], **{k: row[k] for k in ("test", "p_t", "p_exact", "p_exact_se", "smallest_p")},
            "p_tost": tests[key]["p_tost"], "p_tost_holm": p_tost_holm[key], "family_size": len(tests),
            "cohens_d": cohens_d(values[key], reference),
            "verdict": v["verdict"], "verdict_label": v["label"], "verdict_text": v["text"],
            **{k: v[k] for k in VERDICT_KEYS},
            "welch": {**{k: w.get(k) for k in ("difference", "diff_ci_low", "diff_ci_high", "p_value")},
                      # the unpaired difference relative to the reference's mean, in percent
                      **{f"{k}_percent": None if w.get(k) is None or scale is None else w[k] * scale
                         for k in ("difference", "diff_ci_low", "diff_ci_high")}},
        }
    return out


def _family_test(row: dict, margin: float, log: bool, alpha: float) -> dict:
    return {"p_value": row["p_value"],
            "p_tost": tost(row["differences"], margin=margin, log=log, alpha=alpha)["p_value"]}
