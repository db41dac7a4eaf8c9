"""Paired multi-seed comparisons: the paired t-test, equivalence (TOST), the four verdicts and the
power calculations, checked against scipy, simulation and textbook values."""

import math

import numpy as np
import pytest
from scipy import stats as st

from evo_attention.util import stats
from evo_attention.util.errors import UserError


def _perplexities(n=6, shift=-0.02, pair_noise=0.004, seed_noise=0.05, rng_seed=0):
    """Baseline and candidate perplexities on the same seeds: a large per-seed term both share and
    a small per-pair noise, so pairing removes most of the spread."""
    rng = np.random.default_rng(rng_seed)
    seed_effect = rng.normal(0.0, seed_noise, n)
    base = np.exp(3.3 + seed_effect)
    cand = np.exp(3.3 + seed_effect + shift + rng.normal(0.0, pair_noise, n))
    return cand, base


# --- the paired t-test ----------------------------------------------------------------------

@pytest.mark.parametrize("confidence", [0.95, 0.9])
def test_paired_equals_ttest_rel_on_the_log_scale(confidence):
    cand, base = _perplexities()
    r = stats.paired(cand, base, confidence)
    ref = st.ttest_rel(np.log(cand), np.log(base))
    ci = ref.confidence_interval(confidence_level=confidence)
    d = np.log(cand) - np.log(base)
    assert r["scale"] == "log" and r["n"] == 6 and r["n_dropped"] == 0
    assert r["difference"] == pytest.approx(d.mean()) and r["sd_diff"] == pytest.approx(d.std(ddof=1))
    assert r["t"] == pytest.approx(ref.statistic) and r["df"] == 5
    assert r["p_t"] == pytest.approx(ref.pvalue, rel=1e-12)
    # below 12 pairs the exact sign-flip test decides; the t-test's p stands beside it
    assert r["test"] == "sign-flip" and r["p_value"] == r["p_exact"] == pytest.approx(2 / 64)
    assert (r["diff_ci_low"], r["diff_ci_high"]) == pytest.approx((ci.low, ci.high))
    # the relative change of the geometric mean, interval mapped by the same function
    assert r["relative"] == pytest.approx(math.exp(d.mean()) - 1)
    assert r["relative_ci_low"] == pytest.approx(math.expm1(ci.low))
    assert r["relative_ci_high"] == pytest.approx(math.expm1(ci.high))
    assert r["relative_ci_low"] < r["relative"] < r["relative_ci_high"] < 0


def test_paired_linear_scale_equals_ttest_rel_and_is_not_welch():
    cand, base = _perplexities()
    bpb_c, bpb_b = np.log2(cand) / 4, np.log2(base) / 4  # any metric in plain units
    r = stats.paired(bpb_c, bpb_b, log=False)
    ref = st.ttest_rel(bpb_c, bpb_b)
    assert r["scale"] == "linear" and r["relative"] is None and r["relative_ci_low"] is None
    assert r["difference"] == pytest.approx(np.mean(bpb_c - bpb_b))
    assert r["p_t"] == pytest.approx(ref.pvalue, rel=1e-12)
    # the shared seed term hides the shift from an unpaired test; pairing finds it
    assert r["p_t"] < 1e-4 < stats.welch(bpb_c, bpb_b)["p_value"]


def test_failed_seeds_drop_their_pair():
    cand, base = _perplexities(n=7)
    c, b = list(cand), list(base)
    c[2], b[4], c[5] = None, math.nan, math.inf
    r = stats.paired(c, b)
    keep = [0, 1, 3, 6]
    ref = st.ttest_rel(np.log(cand[keep]), np.log(base[keep]))
    assert r["n"] == 4 and r["n_dropped"] == 3 and len(r["differences"]) == 4
    assert r["p_t"] == pytest.approx(ref.pvalue) and r["t"] == pytest.approx(ref.statistic)
    with pytest.raises(UserError, match="one value per seed"):
        stats.paired([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(UserError, match="log=False"):
        stats.paired([1.0, -2.0], [1.0, 2.0])
    assert stats.paired([1.0, -2.0], [1.0, 2.0], log=False)["difference"] == -2.0


def test_without_spread_decided_by_the_exact_test():
    same = stats.paired([10.0, 20.0, 30.0], [10.0, 20.0, 30.0])
    assert same["p_value"] == 1.0 and same["difference"] == 0.0 and same["boot_ci_low"] is None
    shifted = stats.paired([2.0, 3.0, 4.0], [1.0, 2.0, 3.0], log=False)
    # never p = 0 from a t without spread: the exact test's smallest p at 3 pairs
    assert shifted["p_value"] == 0.25 and shifted["p_t"] is None
    assert shifted["diff_ci_low"] == shifted["diff_ci_high"] == 1.0
    one = stats.paired([2.0, None], [1.0, 1.0])
    assert one["n"] == 1 and one["p_value"] is None and one["diff_ci_low"] is None
    assert one["difference"] == pytest.approx(math.log(2.0))
    assert stats.paired([], [])["difference"] is None


def test_bootstrap_interval_is_seeded_and_sensible():
    cand, base = _perplexities(n=10)
    a = stats.paired(cand, base, seed=3)
    b = stats.paired(cand, base, seed=3)
    c = stats.paired(cand, base, seed=4)
    assert (a["boot_ci_low"], a["boot_ci_high"]) == (b["boot_ci_low"], b["boot_ci_high"])
    assert (a["boot_ci_low"], a["boot_ci_high"]) != (c["boot_ci_low"], c["boot_ci_high"])
    assert a["boot_ci_low"] < a["difference"] < a["boot_ci_high"]
    # the bootstrap interval and the t interval of the same mean overlap broadly
    assert a["boot_ci_low"] < a["diff_ci_high"] and a["diff_ci_low"] < a["boot_ci_high"]
    percentile = stats.paired(cand, base, seed=3, bootstrap_method="percentile")
    assert percentile["boot_ci_low"] != a["boot_ci_low"]
    two = stats.paired(cand[:2], base[:2])
    assert two["p_value"] is not None and two["boot_ci_low"] is None and two["boot_ci_high"] is None
    # below 10 pairs BCa covers 72-88% of a nominal 95%: no interval is given
    nine = stats.paired(cand[:9], base[:9])
    assert nine["diff_ci_low"] is not None and nine["boot_ci_low"] is None
    assert stats.paired(cand, base, bootstrap_resamples=0)["boot_ci_low"] is None


# --- equivalence ----------------------------------------------------------------------------

def test_margin_mapping():
    assert stats.margin_bound(0.01) == pytest.approx(math.log(1.01))
    assert stats.margin_bound(0.01, log=False) == 0.01
    for bad in (0, -0.01, math.nan, True):
        with pytest.raises(UserError, match="margin"):
            stats.margin_bound(bad)


@pytest.mark.parametrize("shift, margin", [(0.001, 0.02), (0.015, 0.02), (-0.004, 0.01)])
def test_tost_equals_two_one_sided_ttest_rel(shift, margin):
    cand, base = _perplexities(n=6, shift=shift)
    x, y = np.log(cand), np.log(base)
    bound = math.log1p(margin)
    lower = st.ttest_rel(x + bound, y, alternative="greater").pvalue
    upper = st.ttest_rel(x - bound, y, alternative="less").pvalue
    e = stats.tost(cand, base, margin=margin)
    assert e["bound"] == pytest.approx(bound)
    assert e["p_t"] == pytest.approx(max(lower, upper), rel=1e-9)
    # at 6 pairs the exact one-sided tests decide
    assert e["test"] == "sign-flip" and e["p_value"] == e["p_exact"] == max(e["p_lower"], e["p_upper"])
    # the same from the per-seed differences of ``paired``
    from_diffs = stats.tost(stats.paired(cand, base)["differences"], margin=margin)
    assert from_diffs["p_t"] == pytest.approx(e["p_t"], rel=1e-9) and from_diffs["p_value"] == e["p_value"]
    # from 12 pairs the t-tests decide: equivalent exactly when the 1 - 2 alpha interval lies inside
    cand, base = _perplexities(n=12, shift=shift)
    x, y = np.log(cand), np.log(base)
    lower = st.ttest_rel(x + bound, y, alternative="greater").pvalue
    upper = st.ttest_rel(x - bound, y, alternative="less").pvalue
    e = stats.tost(cand, base, margin=margin)
    assert e["test"] == "t"
    assert e["p_lower"] == pytest.approx(lower, rel=1e-9) and e["p_upper"] == pytest.approx(upper, rel=1e-9)
    assert e["p_value"] == pytest.approx(max(lower, upper), rel=1e-9)
    inside = -bound < e["ci_low"] and e["ci_high"] < bound
    assert e["equivalent"] == inside == (e["p_value"] < 0.05)


def test_tost_outcomes_and_linear_scale():
    cand, base = _perplexities(n=12, shift=0.0, pair_noise=0.002)
    assert stats.tost(cand, base, margin=0.02)["equivalent"] is True
    shifted, base2 = _perplexities(n=12, shift=0.03, pair_noise=0.002)
    assert stats.tost(shifted, base2, margin=0.02)["equivalent"] is False
    x, y = [1.0, 1.2, 0.9, 1.1], [1.05, 1.18, 0.93, 1.12]
    e = stats.tost(x, y, margin=0.1, log=False)
    d = np.subtract(x, y)
    assert e["p_t"] == pytest.approx(max(st.ttest_1samp(d, -0.1, alternative="greater").pvalue,
                                         st.ttest_1samp(d, 0.1, alternative="less").pvalue))
    assert e["p_lower"] == e["p_upper"] == e["p_value"] == 1 / 16  # the exact tests' smallest p at 4 pairs
    # no spread: the exact one-sided tests, whose smallest p at 2 pairs is 1/4
    assert stats.tost([0.0, 0.0], margin=0.01, log=False)["p_value"] == 0.25
    assert stats.tost([0.02, 0.02], margin=0.01, log=False)["p_value"] == 1.0
    assert stats.tost([0.02], margin=0.01, log=False)["p_value"] is None


# --- power and planning ---------------------------------------------------------------------

def _simulated_power(n, sd, effect, alpha=0.05, runs=40000, seed=0):
    d = np.random.default_rng(seed).normal(effect, sd, size=(runs, n))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    return float(np.mean(np.abs(t) > st.t.ppf(1 - alpha / 2, n - 1)))


def _simulated_tost_power(n, sd, bound, true=0.0, alpha=0.05, runs=40000, seed=1):
    d = np.random.default_rng(seed).normal(true, sd, size=(runs, n))
    half = st.t.ppf(1 - alpha, n - 1) * d.std(1, ddof=1) / math.sqrt(n)
    m = d.mean(1)
    return float(np.mean((m - half > -bound) & (m + half < bound)))


@pytest.mark.parametrize("n, sd, effect", [(3, 1.0, 2.0), (6, 1.0, 0.8), (12, 0.02, 0.01)])
def test_power_matches_simulation(n, sd, effect):
    assert stats.power_paired(n, sd, effect) == pytest.approx(_simulated_power(n, sd, effect), abs=0.01)
    assert stats.power_paired(n, sd, -effect) == stats.power_paired(n, sd, effect)
    assert stats.power_paired(n, sd, 0.0) == pytest.approx(0.05)


@pytest.mark.parametrize("n, sd, bound, true", [(4, 1.0, 1.5, 0.0), (8, 1.0, 1.0, 0.0), (10, 1.0, 1.0, 0.4)])
def test_tost_power_matches_simulation(n, sd, bound, true):
    exact = stats.power_tost(n, sd, bound, true_difference=true)
    assert exact == pytest.approx(_simulated_tost_power(n, sd, bound, true), abs=0.01)


def test_seeds_for_effect_textbook_and_power_boundary():
    assert stats.seeds_for_effect(1.0, 0.5) == 34  # d = 0.5, power 0.8, alpha 0.05: the textbook 34
    assert stats.seeds_for_effect(1.0, 1.0) == 10
    z = st.norm.ppf(0.975) + st.norm.ppf(0.8)
    for sd, effect in [(1.0, 0.3), (0.02, 0.01), (0.05, 0.02), (1.0, 0.7), (3.0, 2.0)]:
        n = stats.seeds_for_effect(sd, effect)
        normal = math.ceil((z * sd / effect) ** 2)
        assert normal <= n <= normal + 2, (sd, effect, n, normal)
        assert stats.power_paired(n, sd, effect) >= 0.8 > stats.power_paired(n - 1, sd, effect)
    one_sided = stats.seeds_for_effect(1.0, 0.5, two_sided=False)
    assert one_sided < 34 and stats.power_paired(one_sided, 1.0, 0.5, two_sided=False) >= 0.8
    assert stats.seeds_for_effect(1.0, 0.5, max_seeds=20) is None
    assert stats.seeds_for_effect(1.0, 0.5, max_seeds=34) == 34
    assert stats.seeds_for_effect(1.0, 0.0) is None and stats.seeds_for_effect(0.0, 0.1) == 2
    assert stats.seeds_for_effect(0.1, 5.0) == 2  # a huge effect: the minimum


def test_minimal_detectable_effect_is_the_inverse_of_power():
    for n in (2, 3, 5, 10, 40):
        mde = stats.minimal_detectable_effect(n, 0.03)
        assert stats.power_paired(n, 0.03, mde) == pytest.approx(0.8, abs=1e-6)
        assert stats.seeds_for_effect(0.03, mde * 1.000001) == n
    assert stats.minimal_detectable_effect(10, 1.0) == pytest.approx(0.996, abs=0.001)  # textbook d
    assert stats.minimal_detectable_effect(5, 1.0) > stats.minimal_detectable_effect(6, 1.0)
    assert stats.minimal_detectable_effect(1, 1.0) is None and stats.minimal_detectable_effect(5, 0.0) == 0.0
    assert stats.minimal_detectable_effect(10, 1.0, power=0.9) > stats.minimal_detectable_effect(10, 1.0)


def test_power_is_finite_far_in_the_tails():
    # scipy's nct.cdf returns NaN for some far-left arguments; the power must not
    for n in (2, 3, 6, 11, 31):
        for effect in np.linspace(0.5, 60.0, 120):
            p = stats.power_paired(n, 1.0, effect)
            assert math.isfinite(p) and 0.0 < p <= 1.0


def test_power_is_one_at_a_huge_effect_to_sd_ratio():
    """scipy's nct.sf is NaN from a noncentrality of ~2e9 (a near-degenerate pilot reaches it): power_paired
    was NaN and seeds_for_effect said 4; the power there is 1 to the last bit."""
    assert stats.power_paired(2, 1.0, 3e9) == stats.power_paired(12, 1.0, 1e9) == 1.0
    assert stats.power_paired(12, 1.0, 1e9, two_sided=False) == stats.verdict_power(30, 1.0, 3e9) == 1.0
    assert stats.seeds_for_effect(1e-10, 1.0) == 2
    with pytest.raises(UserError, match="no reliable value") as raised:  # 2 pairs at alpha 1e-10: not 1, no value
        stats.power_paired(2, 1.0, 3e9, alpha=1e-10)
    assert raised.value.setting == "alpha"


def test_seeds_for_equivalence_power_boundary():
    for sd, bound in [(1.0, 1.0), (0.01, math.log1p(0.01)), (0.03, math.log1p(0.05))]:
        n = stats.seeds_for_equivalence(sd, bound)
        assert n >= 2 and stats.power_tost(n, sd, bound) >= 0.8
        if n > 2:
            assert stats.power_tost(n - 1, sd, bound) < 0.8
    # more seeds when the true difference sits nearer a bound, none at or beyond it
    assert stats.seeds_for_equivalence(1.0, 1.0, true_difference=0.5) > stats.seeds_for_equivalence(1.0, 1.0)
    assert stats.seeds_for_equivalence(1.0, 1.0, true_difference=1.0) is None
    assert stats.seeds_for_equivalence(1.0, 0.01, max_seeds=100) is None


# --- the four verdicts ----------------------------------------------------------------------

def test_clear_improvement_is_better_and_degradation_worse():
    cand, base = _perplexities(n=12, shift=-0.03)
    v = stats.paired_verdict(stats.paired(cand, base), margin=0.01)
    assert v["verdict"] == v["label"] == "better" and v["p_value"] < 0.001
    assert v["text"].startswith("better: -3.") and "12 paired seeds" in v["text"] and "t-test p" in v["text"]
    worse, base2 = _perplexities(n=12, shift=0.03)
    w = stats.paired_verdict(stats.paired(worse, base2), margin=0.01)
    assert w["verdict"] == "worse" and w["relative"] > 0
    # higher is better (accuracy): the same numbers read the other way round
    acc = stats.paired_verdict(stats.paired(worse, base2, log=False), margin=0.5, lower_is_better=False)
    assert acc["verdict"] == "better"


def test_tiny_spread_around_zero_is_equivalent():
    rng = np.random.default_rng(5)
    base = np.exp(3.3 + rng.normal(0.0, 0.05, 5))
    cand = base * np.exp(rng.normal(0.0, 0.002, 5))
    v = stats.paired_verdict(stats.paired(cand, base), margin=0.05)
    assert v["verdict"] == "equivalent" and v["label"] == "equivalent within ±5%"
    assert v["p_tost"] < 0.05 and v["text"].startswith("equivalent within ±5%:")
    # the same data against a far narrower margin cannot be shown equivalent
    narrow = stats.paired_verdict(stats.paired(cand, base), margin=0.0001)
    assert narrow["verdict"] == "undetermined"


def test_two_noisy_seeds_are_undetermined_with_seeds_needed():
    r = stats.paired([31.0, 29.5], [30.0, 30.4])
    v = stats.paired_verdict(r, margin=0.01)
    assert v["verdict"] == "undetermined" and v["n"] == 2
    sd, bound = r["sd_diff"], math.log1p(0.01)
    # at the observed sd the t-test would need 173 seeds; at the sd's 80% upper bound from 2 values
    # (3.9x) the plan needs more than max_seeds (1000)
    assert v["seeds_for_equivalence_range"] == [stats.seeds_for_equivalence(sd, bound), None]
    assert v["seeds_for_margin_range"][0] == stats.seeds_for_effect(sd, bound) > 12
    assert v["seeds_for_equivalence"] is None and v["seeds_for_margin"] is None
    assert v["mde"] is None  # 2 seeds: the exact test's smallest p is 0.5
    assert f"{v['seeds_for_equivalence_range'][0]}..more than 1000 paired seeds would show equivalence within ±1%" \
        in v["text"]
    # more pairs: the mde at Holm's level
    r8 = stats.paired([31.0, 29.5, 30.5, 30.1, 29.9, 30.6, 30.2, 29.8], [30.0, 30.4, 30.1, 30.3, 30.0, 30.2, 29.9, 30.1])
    v8 = stats.paired_verdict(r8, margin=0.01, family_size=2)
    assert v8["mde"] == pytest.approx(stats.minimal_detectable_effect(8, r8["sd_diff"], alpha=0.025))
    assert v8["mde_relative"] == pytest.approx(math.expm1(v8["mde"]))
    capped = stats.paired_verdict(r, margin=0.0001, max_seeds=50)
    assert capped["seeds_for_margin"] is None and "more than 50" in capped["text"]
    lone = stats.paired_verdict(stats.paired([31.0, None], [30.0, 30.4]), margin=0.01)
    assert lone["verdict"] == "undetermined" and lone["mde"] is None and "fewer than 2" in lone["text"]


def test_an_undetermined_verdicts_seed_plan_never_contradicts_the_data():
    """+2% with an interval of +2% to +2% said '5 paired seeds would show equivalence within ±1%' (planned at a
    true difference of 0): a difference beyond the margin now gets the seeds to detect it (seeds_to_decide), one
    inside it whose interval excludes 0 the plan's assumption."""
    ref = [30.0, 31.0, 29.5, 30.2, 30.8]
    far = stats.paired_verdict(stats.paired([x * 1.02 * (1 + 1e-7 * i) for i, x in enumerate(ref)], ref), 0.01)
    assert far["verdict"] == "undetermined" and far["seeds_to_decide_range"] == [6, 6]
    assert "; 6 paired seeds would detect the observed +2%, 6 would detect a ±1% effect" in far["text"]
    assert "equivalence within ±1%," not in far["text"]
    near = stats.paired_verdict(stats.paired([x * 1.005 * (1 + 1e-4 * i) for i, x in enumerate(ref[:3])], ref[:3]),
                                0.01)
    assert near["verdict"] == "undetermined" and near["diff_ci_low"] > 0
    assert "; 5 paired seeds would show equivalence within ±1% if the true difference were 0, 6 would" in near["text"]


def test_adjusted_p_value_decides():
    base = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0]
    r = stats.paired(np.add(base, [-0.5, -0.3, -0.45, -0.2, -0.4, 0.1, -0.35]), base, log=False)
    assert 0.005 < r["p_value"] < 0.05 and r["test"] == "sign-flip"  # 2 * 2 / 128 = 0.03125
    assert stats.paired_verdict(r, margin=0.01)["verdict"] == "better"
    adjusted = stats.paired_verdict(r, margin=0.01, p_adjusted=min(1.0, r["p_value"] * 6))
    assert adjusted["verdict"] == "undetermined" and adjusted["p_adjusted"] is True
    assert "(adjusted)" in adjusted["text"]
    with pytest.raises(UserError, match="alpha"):
        stats.paired_verdict(r, margin=0.01, alpha=5)
    with pytest.raises(UserError, match="power"):
        stats.paired_verdict(r, margin=0.01, power=80)


def test_holm_family_keeps_keys():
    adjusted = stats.holm_family({"a": 0.01, "b": 0.04, "c": None, "d": 0.03, "e": 0.005})
    assert list(adjusted) == ["a", "b", "c", "d", "e"]
    assert adjusted == {"a": pytest.approx(0.03), "b": pytest.approx(0.06), "c": None,
                        "d": pytest.approx(0.06), "e": pytest.approx(0.02)}
    assert stats.holm_family({}) == {}


# --- transfer between sizes -----------------------------------------------------------------

def test_interaction_paired_when_seeds_match_welch_otherwise():
    small = {1: -0.030, 2: -0.025, 3: -0.035, 4: -0.028}
    large = {1: -0.012, 2: -0.010, 3: -0.016, 4: -0.009}
    r = stats.paired_interaction(small, large)
    a, b = np.array(list(small.values())), np.array(list(large.values()))
    ref = st.ttest_rel(b, a)
    assert r["test"] == "paired" and r["n_a"] == r["n_b"] == 4
    assert r["change"] == pytest.approx(np.mean(b - a)) and r["p_t"] == pytest.approx(ref.pvalue)
    ci = ref.confidence_interval()
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((ci.low, ci.high))
    assert r["change"] > 0 and r["p_t"] < 0.05  # the advantage shrinks at the larger size
    assert r["p_value"] == 0.125  # the exact test decides at 4 pairs: its smallest p
    # order of the mapping does not matter: pairs are matched by seed
    shuffled = {k: large[k] for k in (3, 1, 4, 2)}
    assert stats.paired_interaction(small, shuffled)["p_value"] == pytest.approx(r["p_value"])
    other = {5: -0.012, 6: -0.010, 7: -0.016}
    w = stats.paired_interaction(small, other)
    ref_w = st.ttest_ind(list(other.values()), list(small.values()), equal_var=False)
    assert w["test"] == "welch" and w["n_b"] == 3 and w["p_value"] == pytest.approx(ref_w.pvalue)
    # a failed seed at one size breaks the pairing
    failed = {**large, 4: None}
    assert stats.paired_interaction(small, failed)["test"] == "welch"
    # sequences are aligned by position unless told the seeds differ
    assert stats.paired_interaction(list(a), list(b))["p_t"] == pytest.approx(ref.pvalue)
    assert stats.paired_interaction(list(a), list(b), shared_seeds=False)["test"] == "welch"
    with pytest.raises(UserError, match="mappings"):
        stats.paired_interaction(small, list(b))
