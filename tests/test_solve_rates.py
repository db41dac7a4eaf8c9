"""Solve-rate verdicts for solved/unsolved outcomes: exact intervals, Fisher/Barnard with Holm,
and the seeds a stated difference of solve rates needs (exact power by enumeration)."""

import numpy as np
import pytest
from scipy import stats as st

from evo_attention.util import stats
from evo_attention.util.errors import UserError


def test_solve_rate_has_the_clopper_pearson_interval():
    r = stats.solve_rate(3, 8)
    ci = st.binomtest(3, 8).proportion_ci(method="exact")
    assert r["rate"] == 3 / 8 and (r["ci_low"], r["ci_high"]) == pytest.approx((ci.low, ci.high))
    assert stats.solve_rate(0, 3)["ci_low"] == 0.0 and stats.solve_rate(0, 0)["rate"] is None
    with pytest.raises(UserError, match="solve count"):
        stats.solve_rate(4, 3)


def test_fisher_and_barnard_with_holm():
    rows = stats.solve_rates_versus({"a": (8, 8), "b": (4, 8)}, (0, 8))
    assert rows["a"]["p_value"] == pytest.approx(st.fisher_exact([[8, 0], [0, 8]]).pvalue)
    assert rows["a"]["p_holm"] == pytest.approx(2 * rows["a"]["p_value"]) and rows["a"]["family_size"] == 2
    assert rows["a"]["verdict"] == "solves more often" and rows["b"]["verdict"] == "undetermined"
    assert rows["a"]["cannot_decide"] is None
    barnard = stats.solve_rates_versus({"b": (6, 8)}, (1, 8), test="barnard")["b"]
    assert barnard["p_value"] == pytest.approx(st.barnard_exact([[6, 2], [1, 7]]).pvalue)
    # 3 seeds a side: even 3 of 3 against 0 of 3 gives p 0.1 (Fisher)
    few = stats.solve_rates_versus({"w": (0, 3)}, (3, 3))["w"]
    assert few["verdict"] == "undetermined" and few["p_value"] == pytest.approx(0.1)
    assert few["cannot_decide"] == "3 against 3 seeds cannot decide: the smallest possible p is 0.1"
    with pytest.raises(UserError, match="solve-rate test"):
        stats.solve_rate_test((1, 2), (0, 2), "chi2")


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_the_enumerated_fisher_p_equals_scipy(n):
    table = stats._fisher_p_tables(n)
    for a in range(n + 1):
        for b in range(n + 1):
            assert table[a, b] == pytest.approx(st.fisher_exact([[a, n - a], [b, n - b]]).pvalue, rel=1e-9)


def test_seeds_for_a_solve_rate_difference_reach_the_power_in_simulation():
    n = stats.seeds_for_solve_rates(0.9, 0.3, power=0.8, alpha=0.05, family_size=2)
    assert n is not None and stats.power_solve_rates(n, 0.9, 0.3, 0.025) >= 0.8
    assert stats.power_solve_rates(n - 1, 0.9, 0.3, 0.025) < 0.8
    rng = np.random.default_rng(0)
    a, b = rng.binomial(n, 0.9, 4000), rng.binomial(n, 0.3, 4000)
    table = stats._fisher_p_tables(n)
    assert np.mean(table[a, b] < 0.025) == pytest.approx(stats.power_solve_rates(n, 0.9, 0.3, 0.025), abs=0.025)
    assert stats.seeds_for_solve_rates(0.5, 0.5) is None


@pytest.mark.parametrize("rate", [1.5, -1.0, float("nan")])
def test_a_solve_rate_outside_0_1_is_refused(rate):
    """A rate of 1.5 weighted the outcome tables by a binomial pmf that is not one (power 1.0, 4 seeds)."""
    with pytest.raises(UserError, match="is not a solve rate in \\[0, 1\\]") as raised:
        stats.power_solve_rates(5, rate, 0.2)
    assert raised.value.setting == "rate"
    with pytest.raises(UserError, match="reference_rate"):
        stats.seeds_for_solve_rates(0.2, rate)


def test_a_reference_by_key_without_a_key_is_refused():
    with pytest.raises(UserError, match="the reference has no counts for 'b'") as raised:
        stats.solve_rates_versus({"a": (1, 3), "b": (2, 3)}, {"a": (3, 3)})
    assert raised.value.setting == "reference"
