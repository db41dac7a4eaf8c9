"""The exact paired sign-flip test, its equivalence counterpart, the verdict rule's choice of test
(exact below 12 pairs or with a degenerate spread) and the one-line 'cannot decide' message."""

import itertools

import numpy as np
import pytest
from scipy import stats as st

from evo_attention.util import stats
from evo_attention.util.errors import UserError


def _brute_force(d, alternative):
    """The sign-flip p by enumerating every sign pattern with itertools (the definition)."""
    d = list(d)
    observed = sum(d)
    tol = 1e-9 * sum(abs(x) for x in d)
    hits = total = 0
    for signs in itertools.product((1.0, -1.0), repeat=len(d)):
        s = sum(a * b for a, b in zip(signs, d))
        total += 1
        if alternative == "two-sided":
            hits += abs(s) >= abs(observed) - tol
        elif alternative == "greater":
            hits += s >= observed - tol
        else:
            hits += s <= observed + tol
    return hits / total


@pytest.mark.parametrize("n", range(1, 13))
@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_sign_flip_equals_brute_force_enumeration(n, alternative):
    rng = np.random.default_rng(n)
    for d in (rng.normal(0.3, 1.0, n), np.round(rng.normal(0.0, 2.0, n)) / 500):  # continuous and tied
        r = stats.sign_flip(d, alternative)
        assert r["exact"] and r["patterns"] == 2 ** n and r["se"] == 0.0
        assert r["p_value"] == pytest.approx(_brute_force(d, alternative), abs=1e-15)


def test_sign_flip_agrees_with_scipy_permutation_test():
    d = np.random.default_rng(3).normal(0.4, 1.0, 9)
    ref = st.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=np.inf)
    assert stats.sign_flip(d)["p_value"] == pytest.approx(ref.pvalue)


def test_monte_carlo_beyond_sixteen_pairs_states_its_error_and_is_seeded():
    d = np.random.default_rng(0).normal(0.25, 1.0, 20)
    a, b = stats.sign_flip(d, seed=1), stats.sign_flip(d, seed=1)
    assert not a["exact"] and a["patterns"] == stats.SIGN_FLIP_RESAMPLES and a == b
    assert 0 < a["se"] < 0.002 and a["p_value"] > 0
    exact = _exact_by_halves(d)
    assert abs(a["p_value"] - exact) < 4 * a["se"] + 1e-5
    with pytest.raises(UserError, match="alternative"):
        stats.sign_flip(d, "both")


def _exact_by_halves(d):
    """The exact two-sided p of 20 values: the sums of the first ten's patterns against the last ten's."""
    a = stats._sign_patterns(10) @ d[:10]
    b = stats._sign_patterns(10) @ d[10:]
    total = np.abs(a[:, None] + b[None, :])
    return float(np.mean(total >= abs(d.sum()) - 1e-9 * np.abs(d).sum()))


def test_smallest_p_and_equivalence_counterpart():
    assert stats.smallest_p(3) == 0.25 and stats.smallest_p(3, "greater") == 0.125
    assert stats.smallest_p(5) == 0.0625 and stats.smallest_p(6) == 0.03125
    d = np.array([0.001, -0.002, 0.0015, 0.0005, -0.001, 0.002])
    e = stats.sign_flip_tost(d, 0.02)
    assert e["p_lower"] == pytest.approx(_brute_force(d + 0.02, "greater"))
    assert e["p_upper"] == pytest.approx(_brute_force(d - 0.02, "less"))
    assert e["p_value"] == max(e["p_lower"], e["p_upper"]) == pytest.approx(1 / 64)


def test_zero_spread_is_decided_exactly_never_p_zero():
    """The issue's example: three identical +1/500 differences, an effect 10x below the margin."""
    rows = stats.versus_reference({"g": [251 / 500, 253 / 500, 250 / 500]}, [250 / 500, 252 / 500, 249 / 500],
                                  log=False, margin=0.02, lower_is_better=False)
    g = rows["g"]
    assert g["verdict"] == "undetermined" and g["p_value"] == pytest.approx(0.25) and g["test"] == "sign-flip"
    assert g["p_t"] is None and g["p_tost"] == pytest.approx(0.125)
    assert "3 seeds cannot decide: the smallest possible p is 0.25" in g["verdict_text"]
    # exactly zero spread, and a spread at rounding level, likewise: no t, the exact p
    for diffs in ([0.01, 0.01, 0.01, 0.01], [0.01, 0.01 * (1 + 1e-12), 0.01, 0.01]):
        r = stats.paired(diffs, [0.0] * 4, log=False)
        assert r["p_t"] is None and r["t"] is None and r["p_value"] == pytest.approx(0.125)
    # at 12 pairs or more a degenerate spread still goes to the exact test
    many = stats.paired([0.01] * 14, [0.0] * 14, log=False)
    assert many["test"] == "sign-flip" and many["p_value"] == pytest.approx(2.0 ** -13)


def test_the_rule_picks_exact_below_twelve_pairs_and_t_from_twelve():
    rng = np.random.default_rng(1)
    for n, test in ((11, "sign-flip"), (12, "t")):
        d = rng.normal(0.5, 1.0, n)
        r = stats.paired(d, np.zeros(n), log=False)
        assert r["test"] == test and r["p_t"] == pytest.approx(st.ttest_1samp(d, 0.0).pvalue)
        assert r["p_exact"] == pytest.approx(_brute_force(d, "two-sided"))
        assert r["p_value"] == (r["p_exact"] if test == "sign-flip" else r["p_t"])
        e = stats.tost(d, np.zeros(n), margin=0.3, log=False)
        assert e["test"] == test


def test_a_three_seed_comparison_says_it_cannot_reach_alpha():
    assert stats.cannot_decide(3) == "3 seeds cannot decide: the smallest possible p is 0.25"
    assert stats.cannot_decide(5) == "5 seeds cannot show a difference: the smallest possible p is 0.0625"
    assert stats.cannot_decide(6) is None and stats.cannot_decide(12) is None
    # Holm: the family's size multiplies the smallest p of its first step
    assert stats.cannot_decide(6, 0.05, 6) == ("6 seeds cannot decide: the smallest possible p is 0.0312 "
                                               "(0.188 after Holm over 6 comparisons)")
    # a clear effect on 3 seeds: the t-test alone would call it, the exact test cannot
    base = [30.0, 31.0, 29.5]
    rows = stats.versus_reference({"g": [29.0, 30.1, 28.4]}, base, margin=0.01)
    assert rows["g"]["p_t"] < 0.05 and rows["g"]["verdict"] == "undetermined"
    assert rows["g"]["cannot_decide"] == "3 seeds cannot decide: the smallest possible p is 0.25"


# --- seed plans at Holm's level, from the pilot's sd at an upper bound ---------------------------

def _rule_power(n, sd, effect, alpha_holm, m, reps=3000, seed=7):
    """Simulated power of the first member of a family of m comparisons (every one with the same
    true effect) under Holm's procedure, each decided by the rule's test (exact below 12 pairs:
    brute force over the sign patterns with itertools; t from 12: scipy)."""
    rng = np.random.default_rng(seed)
    d = rng.normal(effect, sd, size=(reps, m, n))
    if n < stats.EXACT_BELOW:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))  # (2^n, n)
        sums = d @ signs.T
        observed = np.abs(d.sum(axis=2, keepdims=True))
        p = (np.abs(sums) >= observed - 1e-12).mean(axis=2)
    else:
        p = st.ttest_1samp(d, 0.0, axis=2).pvalue
    hits = 0
    for row in p:
        hits += stats.holm(list(row))[0] < alpha_holm * m
    return hits / reps


@pytest.mark.parametrize("sd, effect, m", [(0.01, 0.012, 3), (0.02, 0.012, 2), (0.01, 0.03, 6)])
def test_a_planned_n_reaches_the_power_at_holms_level_in_simulation(sd, effect, m):
    plan = stats.seed_plan(sd, 3, effect, power=0.8, alpha=0.05, family_size=m)
    assert plan["alpha_holm"] == pytest.approx(0.05 / m) and plan["family_size"] == m
    assert plan["sd_upper"] == pytest.approx(sd * np.sqrt(2 / st.chi2.ppf(0.2, 2)))
    assert plan["n_point"] <= plan["n_upper"] == plan["seeds"]
    assert f"{plan['n_point']}..{plan['n_upper']} paired seeds" in plan["text"] or plan["n_point"] == plan["n_upper"]
    # the plan at the point estimate reaches 80% power when the pilot's sd is the truth, the plan at
    # the bound when the truth is the bound (3000 runs: standard error 0.007)
    assert _rule_power(plan["n_point"], sd, effect, 0.05 / m, m) >= 0.8 - 0.02
    assert _rule_power(plan["n_upper"], plan["sd_upper"], effect, 0.05 / m, m) >= 0.8 - 0.02
    # the plan asks more than the t-test alone would at the uncorrected level
    assert plan["n_point"] >= stats.seeds_for_effect(sd, effect, 0.8, 0.05)


def test_the_verdict_names_the_seed_range_at_holms_level():
    rows = stats.versus_reference({"g": [31.0, 29.5, 30.2], "h": [30.1, 30.5, 29.9]}, [30.0, 30.4, 30.0], margin=0.01)
    h = rows["h"]
    low, high = h["seeds_for_equivalence_range"]
    assert low < high == h["seeds_for_equivalence"]
    sd = h["sd_diff"]
    assert low == stats.seeds_for_verdict_equivalence(sd, np.log1p(0.01), alpha=0.025, max_seeds=1000)
    assert f"{low}..{high} paired seeds would show equivalence" in h["verdict_text"]


def test_a_verdict_says_when_its_t_interval_disagrees_with_the_exact_test_that_decides():
    import math

    from evo_attention.util.stats import versus_reference

    def text(differences):
        return versus_reference({"g": [10 * math.exp(x) for x in differences]}, [10.0] * 6,
                               margin=0.01)["g"]["verdict_text"]

    note = "the t interval is not the deciding test's"
    far = text([-0.002, -0.002, -0.003, -0.002, -0.002, -0.6])  # every sign down, one far seed
    assert far.startswith("better: -9.68% (95% CI -30.1% to +16.7%)") and note in far
    assert text([0.009] * 5 + [-0.009]).startswith("equivalent within ±1%") and note in text([0.009] * 5 + [-0.009])
    assert note not in text([-0.02, -0.03, -0.025, -0.02, -0.03, -0.02])  # the interval agrees: nothing to say


@pytest.mark.parametrize("call, name", [
    (lambda v: stats.power_paired(5, 1.0, v), "effect"),
    (lambda v: stats.seeds_for_effect(0.01, v), "effect"),
    (lambda v: stats.power_tost(5, 0.01, 0.01, true_difference=v), "true_difference"),
    (lambda v: stats.seeds_for_equivalence(0.01, 0.01, true_difference=v), "true_difference"),
    (lambda v: stats.seeds_for_verdict(0.0, v), "effect"),
    (lambda v: stats.seeds_for_verdict_equivalence(0.0, 0.01, true_difference=v), "true_difference"),
    (lambda v: stats.seed_plan(0.01, 3, v), "effect"),
    (lambda v: stats.verdict_power(5, 0.01, v), "effect"),
])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_effect_is_refused_by_every_power_and_seed_count(call, name, value):
    """A NaN effect compares false with every power (seeds_for_effect gave 4), an infinite one gave power NaN."""
    with pytest.raises(UserError, match="must be a finite number") as raised:
        call(value)
    assert raised.value.setting == name


def test_the_exact_tests_seed_counts_reach_any_alpha_and_name_it():
    """The counts searched 2..63 seeds only: a tiny alpha ended in a bare StopIteration (a RuntimeError in
    seed_plan), and decisive_seeds spoke of a confidence it was not given."""
    assert stats.seeds_for_verdict(0.0, 0.01, alpha=1e-20) == 68
    assert stats.smallest_p(67) >= 1e-20 > stats.smallest_p(68)
    assert stats.seed_plan(0.0, 3, 0.01, alpha=1e-20, equivalence=True)["seeds"] == 67
    assert stats.decisive_seeds(1, 1e-17) == stats.EXACT_BELOW  # from there the t-test decides
    for alpha in (0.5, 0.0):
        with pytest.raises(UserError, match=f"^alpha {alpha!r} is outside"):
            stats.decisive_seeds(1, alpha)


def test_seed_counts_at_a_tiny_alpha_follow_the_rule():
    """At alpha 1e-16, 1 - alpha / 2 rounded to 1.0: power_paired's critical t was infinite and seeds_for_verdict
    None ('more than 1000000'); decisive_seeds said 35 at 1e-10 where the t-test decides from EXACT_BELOW seeds."""
    assert stats.seeds_for_verdict(0.01, 0.01, alpha=1e-16) == 116
    assert stats.seeds_for_verdict(0.01, 0.01, alpha=1e-15) == 109
    assert stats.decisive_seeds(1, 1e-10) == stats.EXACT_BELOW and stats.cannot_decide(stats.EXACT_BELOW, 1e-10) is None
    assert stats.cannot_decide(stats.EXACT_BELOW - 1, 1e-10) and stats.decisive_seeds(3) == 7
    assert stats.seeds_for_verdict(0.0, 0.01, alpha=1e-10) == 35  # no spread: the exact test decides at any n
