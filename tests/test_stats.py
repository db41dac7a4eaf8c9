"""The statistics of multi-seed comparisons, on inputs with known answers."""

import math

import numpy as np
import pytest
from scipy import stats as st

from evo_attention.util import stats
from evo_attention.studies.common import validation_seeds
from evo_attention.util.errors import UserError


def test_describe_hand_computed():
    d = stats.describe([1, 2, 3, 4, 5])
    assert d["n"] == 5 and d["mean"] == 3.0 and d["sd"] == pytest.approx(math.sqrt(2.5))
    half = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)  # t(0.975, 4) * sd / sqrt(n)
    assert d["ci_low"] == pytest.approx(3 - half) and d["ci_high"] == pytest.approx(3 + half)
    wider = stats.describe([1, 2, 3, 4, 5], confidence=0.99)
    assert wider["ci_low"] < d["ci_low"] and wider["ci_high"] > d["ci_high"]


def test_describe_skips_failures_and_needs_two_values():
    d = stats.describe([2.0, None, math.inf, math.nan, 4.0])
    assert d["n"] == 2 and d["mean"] == 3.0
    one = stats.describe([7.0, None])
    assert one == {"n": 1, "mean": 7.0, "sd": None, "ci_low": None, "ci_high": None}
    assert stats.describe([])["mean"] is None


def test_identical_samples_are_not_distinguishable():
    a = [8.1, 8.4, 7.9, 8.3, 8.0]
    w = stats.welch(a, list(a))
    assert w["difference"] == 0.0 and w["p_value"] == pytest.approx(1.0) and w["cohens_d"] == 0.0
    assert w["diff_ci_low"] < 0 < w["diff_ci_high"]
    constant = stats.welch([5.0, 5.0, 5.0], [5.0, 5.0])  # no spread at all: decided exactly
    assert constant["p_value"] == 1.0


def test_large_shift_is_significant_in_the_right_direction():
    rng = np.random.default_rng(1)
    base = 10 + rng.normal(0, 0.2, 5)
    better, worse = base - 2.0 + rng.normal(0, 0.2, 5), base + 2.0 + rng.normal(0, 0.2, 5)
    rows = {"better": stats.welch(better, base), "worse": stats.welch(worse, base)}
    assert max(stats.holm([rows["better"]["p_value"], rows["worse"]["p_value"]])) < 1e-4
    assert rows["better"]["diff_ci_high"] < 0 < rows["worse"]["diff_ci_low"]
    assert rows["better"]["cohens_d"] < -3 < 3 < rows["worse"]["cohens_d"]
    # constant samples with different means: exact decision, p = 0
    assert stats.welch([1.0, 1.0], [2.0, 2.0])["p_value"] == 0.0


def test_welch_is_welch_not_student():
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 4.0, 6.0, 9.0, 1.0]
    w = stats.welch(a, b)
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))  # Welch-Satterthwaite
    t = (np.mean(a) - np.mean(b)) / math.sqrt(va + vb)
    assert w["df"] == pytest.approx(df) and w["t"] == pytest.approx(t)
    assert w["p_value"] == pytest.approx(2 * st.t.sf(abs(t), df))
    half = st.t.ppf(0.975, df) * math.sqrt(va + vb)
    assert w["diff_ci_low"] == pytest.approx(t * math.sqrt(va + vb) - half)
    assert w["diff_ci_high"] == pytest.approx(t * math.sqrt(va + vb) + half)
    assert df != len(a) + len(b) - 2


def test_cohens_d_hand_computed():
    assert stats.cohens_d([1, 2, 3], [2, 3, 4]) == pytest.approx(-1.0)  # pooled sd 1
    assert stats.cohens_d([1, 2, 3], [5]) is None


def test_holm_textbook_example():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> kept at 0.06
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, None, 0.9]) == [pytest.approx(1.0), None, pytest.approx(1.0)]
    assert stats.holm([]) == [] and stats.holm([0.02]) == [0.02]
    # at alpha 0.05 Holm rejects 0.005 and 0.01 only; Bonferroni (x4) would reject 0.005 only
    adjusted = stats.holm([0.01, 0.04, 0.03, 0.005])
    assert [p < 0.05 for p in adjusted] == [True, False, False, True]
    # any iterable: an iterator was walked once and then indexed empty (IndexError)
    assert stats.holm(iter([0.01])) == [0.01] and stats.holm(p for p in (0.01, 0.04)) == [0.02, 0.04]


def test_holm_leaves_a_nan_out_of_the_family_and_refuses_a_p_outside_0_1():
    """A NaN p (no test) is no member of the family, like None: it made the others' family 4, and sorted
    NaN takes the top rank."""
    adjusted = stats.holm([0.01, math.nan, 0.02, 0.03])
    assert [adjusted[i] for i in (0, 2, 3)] == pytest.approx([0.03, 0.04, 0.04]) and math.isnan(adjusted[1])
    for bad in (1.5, -0.1, math.inf):
        with pytest.raises(UserError, match="outside \\[0, 1\\]"):
            stats.holm([0.01, bad])


def test_holm_over_a_larger_family_never_lowers_a_p_value():
    rng = np.random.default_rng(3)
    base = rng.normal(10, 1, 5)
    moderate = stats.welch(base - 1.6 + rng.normal(0, 0.3, 5), base)["p_value"]
    others = [stats.welch(base + rng.normal(0, 1, 5), base)["p_value"] for _ in range(6)]
    assert stats.holm([moderate]) == [moderate] and stats.holm([moderate, *others])[0] >= moderate


def test_too_few_seeds():
    assert stats.welch([3.0], [1.0, 2.0])["p_value"] is None


def test_confidence_interval_coverage_by_simulation():
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(400):
        d = stats.describe(rng.normal(10.0, 2.0, 5))
        covered += d["ci_low"] <= 10.0 <= d["ci_high"]
    assert abs(covered / 400 - 0.95) < 0.035
    covered = 0
    for _ in range(400):  # Welch's interval of a difference with unequal variances and sizes
        w = stats.welch(rng.normal(0.0, 1.0, 5), rng.normal(0.5, 3.0, 8))
        covered += w["diff_ci_low"] <= -0.5 <= w["diff_ci_high"]
    assert abs(covered / 400 - 0.95) < 0.035


def test_bad_confidence_is_a_user_error():
    with pytest.raises(UserError, match="confidence"):
        stats.describe([1, 2], confidence=95)


def test_validation_seeds_never_include_the_search_seed():
    assert validation_seeds(42, 5) == [43, 44, 45, 46, 47]
    assert 42 not in validation_seeds(42, 5, search_seed=42)
    with pytest.raises(UserError, match="include 42, on which the search picked its winners"):
        validation_seeds(40, 5, search_seed=42)
    with pytest.raises(UserError, match="at least 2"):
        validation_seeds(42, 1)


def test_what_is_no_number_is_refused_and_any_real_number_is_a_margin():
    """describe dropped 'x' like a failed seed, a float32 margin was 'not a positive number', and seed_plan
    answered None for a negative bound and planned a family of 0 as one of 1."""
    with pytest.raises(UserError, match="values must be numbers .* not 'x'"):
        stats.describe([1.5, 2.5, "x"])
    assert stats.describe([1.0, None, math.nan, 2.0])["n"] == 2  # failed seeds are still dropped
    assert stats.margin_bound(np.float32(0.1), log=False) == pytest.approx(0.1)
    with pytest.raises(UserError, match="bound -0.01 must be positive"):
        stats.seed_plan(0.01, 3, -0.01, equivalence=True)
    with pytest.raises(UserError, match="family_size 0 must be a count") as raised:
        stats.seed_plan(0.01, 3, 0.01, family_size=0)
    assert raised.value.setting == "family_size"


def test_every_entry_point_refuses_a_family_of_0_and_alpha_is_any_real_number():
    """cannot_decide, decisive_seeds, paired_verdict and seeds_for_solve_rates took a family of 0 for one of 1
    (seed_plan refused it); check_alpha refused numpy's float32 and took a numpy bool's range check."""
    calls = [lambda m: stats.cannot_decide(3, 0.05, m), lambda m: stats.cannot_decide(100, 0.05, m),
             lambda m: stats.cannot_decide(0, 0.05, m), lambda m: stats.decisive_seeds(m),
             lambda m: stats.seeds_for_solve_rates(0.9, 0.1, family_size=m),
             lambda m: stats.paired_verdict(stats.paired([1.0, 1.1, 1.2], [1.05, 1.0, 1.1]), 0.01, family_size=m)]
    for call in calls:
        for bad in (0, -1, True, 1.0):
            with pytest.raises(UserError, match=f"family_size {bad!r} must be a count") as raised:
                call(bad)
            assert raised.value.setting == "family_size"
        call(np.int64(2))
    assert stats.decisive_seeds(1, np.float32(0.05)) == stats.decisive_seeds(1, 0.05)
    for bad in (0.9, math.nan, "x"):  # every path of cannot_decide checks its alpha (it answered None, or a TypeError)
        with pytest.raises(UserError, match="alpha"):
            stats.cannot_decide(3, alpha=bad)
    for bad in (np.bool_(True), "0.05", None):
        with pytest.raises(UserError, match="alpha") as raised:
            stats.check_alpha(bad)
        assert raised.value.setting == "alpha"


def test_a_confidence_is_any_real_number_in_range():
    """check_confidence refused numpy's float32 (its twin check_alpha took it) and a Decimal."""
    import decimal

    level = stats.describe([1.0, 2.0, 4.0], np.float32(0.95))
    assert level["ci_low"] == pytest.approx(stats.describe([1.0, 2.0, 4.0], 0.95)["ci_low"])
    stats.check_confidence(decimal.Decimal("0.9"))
    for bad in (np.bool_(True), True, "0.95", None, 0.5, 1.0, math.nan):
        with pytest.raises(UserError, match="confidence") as raised:
            stats.check_confidence(bad)
        assert raised.value.setting == "confidence"


def test_any_value_float_reads_is_a_number_and_a_bool_or_text_is_refused():
    """A 0-d tensor or array, a Decimal or pandas' NA that marks a failed seed was refused as 'no number', a bool
    was dropped as a failed seed, and holm ended in a bare TypeError on 'x'."""
    import decimal

    pd, torch = pytest.importorskip("pandas"), pytest.importorskip("torch")
    nan = math.nan
    for values in (torch.tensor([10.0, nan, 11.0, 12.0]), [10.0, pd.NA, 11.0, 12.0],
                   [10.0, decimal.Decimal("NaN"), decimal.Decimal("11"), np.array(12.0)]):
        described = stats.describe(values)
        assert described["n"] == 3 and described["mean"] == pytest.approx(11.0)
    for bad in ([1.0, True, 2.0, 3.0], ["x", 1.0, 2.0, 3.0]):
        with pytest.raises(UserError, match="values must be numbers .* not (True|'x')"):
            stats.describe(bad)
        with pytest.raises(UserError, match="values must be numbers"):
            stats.paired(bad, [1.0, 2.0, 3.0, 4.0])
    for bad in (["nan", 2.0, 3.0], [b"inf", 2.0, 3.0], [np.True_, 2.0, 3.0], [torch.tensor(True), 2.0, 3.0]):
        with pytest.raises(UserError, match="values must be numbers"):  # text float() reads, bools of numpy or torch
            stats.describe(bad)
    with pytest.raises(UserError, match="p-values must be numbers"):
        stats.holm([np.True_, 0.01])
    with pytest.raises(UserError, match="p-values must be numbers .* not 'x'") as raised:
        stats.holm([0.01, "x"])
    assert raised.value.setting == "p_values"
    assert stats.holm([0.01, pd.NA, torch.tensor(0.02)])[::2] == pytest.approx([0.02, 0.02])
