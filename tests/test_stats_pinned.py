"""Pins the numbers of ``holm``, ``holm_family``, ``tost`` and the exact sign-flip test
(``sign_flip``, ``sign_flip_tost``): ``fixtures/stats_pinned.json`` holds the inputs and the
outputs these gave when their replacement by library calls was weighed (statsmodels'
``multipletests``/``ttost_paired``, scipy's ``permutation_test``; see the module docstring of
``util/stats.py`` for why they stay ours): small n 1..22, ties, zeros, all-equal samples, negative
and positive effects, failed seeds, n above ``EXACT_BELOW`` and ``EXACT_MAX`` (Monte Carlo, seeded).
Any future swap must keep every number within 1e-12, finite, and None where it was None."""

import json
import math
from pathlib import Path

import pytest

from evo_attention.util import stats

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "stats_pinned.json").read_text())
INPUTS, EXPECTED = FIXTURE["inputs"], FIXTURE["expected"]


def _same(got, want, where=""):
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), where
        for key in want:
            _same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, bool) or want is None or isinstance(want, str):
        assert got == want and type(got) is type(want), (where, got, want)
    else:
        assert isinstance(got, (int, float)) and not isinstance(got, bool), (where, got)
        assert math.isfinite(got), (where, got)
        assert abs(got - want) <= 1e-12, (where, got, want)


@pytest.mark.parametrize("i", range(len(INPUTS["holm"])))
def test_holm_is_unchanged(i):
    _same(stats.holm(INPUTS["holm"][i]), EXPECTED["holm"][i], f"holm[{i}]")


def test_holm_family_is_unchanged():
    family = {f"k{i}": p for i, p in enumerate(INPUTS["holm"][10])}
    _same(stats.holm_family(family), EXPECTED["holm_family"], "holm_family")


@pytest.mark.parametrize("i", range(len(INPUTS["tost"])))
def test_tost_is_unchanged(i):
    kind, data, margin, log, alpha = INPUTS["tost"][i]
    if kind == "diffs":
        got = stats.tost(data, margin=margin, log=log, alpha=alpha)
    else:
        got = stats.tost(data[0], data[1], margin=margin, log=log, alpha=alpha)
    _same(got, EXPECTED["tost"][i], f"tost[{i}]")


@pytest.mark.parametrize("i", range(len(INPUTS["sign_flip"])))
def test_sign_flip_is_unchanged(i):
    d = INPUTS["sign_flip"][i]
    got = {a: stats.sign_flip(d, a)["p_value"] for a in ("two-sided", "greater", "less")}
    e = stats.sign_flip_tost(d, 0.01)
    got["tost"] = [e["p_lower"], e["p_upper"]]
    _same(got, EXPECTED["sign_flip"][i], f"sign_flip[{i}]")
