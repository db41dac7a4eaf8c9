"""Solve-rate verdicts in the curve study: a seed solves a point when its accuracy reaches a
threshold; counts with exact intervals, Fisher/Barnard with Holm, and where the solve rate breaks."""

import json

import pytest
from scipy import stats as st

from evo_attention import Config
from evo_attention.cli import main
from evo_attention.report.studies.curves import BREAK_MARK, curve_markdown, solve_table
from evo_attention.studies.curves import (check_solve_threshold, plan_points, run_curve, solve_break,
                                          solve_statistics)
from evo_attention.util import stats
from evo_attention.util.errors import UserError

DATA = "mqar:seq_len=16,vocab=16,train_examples=64,eval_examples=16"
TINY = {"data": DATA, "vocab_size": None, "max_seq_len": 16, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32,
        "dropout": 0.0, "batch_size": 4, "eval_batch_size": 16, "eval_steps": None, "train_steps": 2, "log_every": 1}
TINY_FLAGS = ["--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32", "--steps", "2", "--batch-size", "4",
              "--eval-batch-size", "16"]


def _gene(name, accuracies_by_value):
    return {"name": name, "gene": f"g-{name}",
            "points": [{"value": v, "accuracy": acc} for v, acc in accuracies_by_value.items()]}


def test_solve_counts_verdicts_and_the_break_with_its_range():
    # 8 seeds per point: the baseline solves every point up to 16, the other stops solving at 8
    base = _gene("baseline", {4: [0.99] * 8, 8: [0.99] * 8, 16: [0.99] * 7 + [0.2], 32: [0.2] * 8})
    other = _gene("window", {4: [0.99] * 8, 8: [0.99] * 3 + [0.3] * 5, 16: [0.3] * 8, 32: [0.3] * 7 + [None]})
    genes = [other, base]
    block = solve_statistics(genes, [4, 8, 16, 32], 0.9, 0.95)
    assert block["reference"] == "baseline" and block["family_size"] == 4 and block["test"] == "fisher"
    rows = {r["value"]: r for r in other["points"]}
    assert rows[8]["solve"]["solved"] == 3 and rows[8]["solve"]["n"] == 8
    assert rows[32]["solve"]["n"] == 7  # a failed seed is left out of n
    ci = st.binomtest(3, 8).proportion_ci(method="exact")
    assert rows[8]["solve"]["ci_low"] == pytest.approx(ci.low) and rows[8]["solve"]["ci_high"] == pytest.approx(ci.high)
    # Fisher's p of 0/8 against 7/8 at 16, Holm over the family of 4
    p16 = st.fisher_exact([[0, 8], [7, 1]]).pvalue
    assert rows[16]["solve_versus"]["p_value"] == pytest.approx(p16)
    holm = stats.holm_family({v: r["solve_versus"]["p_value"] for v, r in rows.items()})
    assert rows[16]["solve_versus"]["p_holm"] == pytest.approx(holm[16])
    assert rows[16]["solve_versus"]["verdict"] == stats.SOLVED_LESS
    assert rows[4]["solve_versus"]["verdict"] == stats.UNDETERMINED
    assert "solve_versus" not in base["points"][0]  # the reference has no verdict of its own
    # the break: 3/8 at 8 is below one half; its interval reaches below one half there and lies below at 16
    assert other["solve_break"]["at"] == 8 and other["solve_break"]["range"] == [8, 16]
    assert base["solve_break"]["at"] == 32 and base["solve_break"]["range"] == [16, 32]


def test_solve_break_without_a_break():
    rates = [stats.solve_rate(10, 10), stats.solve_rate(2, 3)]  # 10/10: [0.69, 1]
    assert solve_break([4, 8], rates) == {"at": None, "rate": None, "range": [8, None]}  # 2/3: [0.09, 0.99]


def test_the_threshold_must_lie_above_the_no_recall_level():
    _, points = plan_points(Config(**TINY), "pairs", [2, 4])
    assert check_solve_threshold(0.9, points, "pairs") == 0.9 and check_solve_threshold(None, points, "pairs") is None
    with pytest.raises(UserError, match=r"at or below the no-recall level 1/pairs = 0.5 at pairs=2") as err:
        check_solve_threshold(0.5, points, "pairs")
    assert err.value.settings == ("solve_threshold",)
    with pytest.raises(UserError, match="an accuracy in"):
        check_solve_threshold(1.5, points, "pairs")


def test_the_solve_table_and_markdown():
    genes = [_gene("baseline", {4: [0.95, 0.95, 0.95], 8: [0.1, 0.1, 0.95]}),
             _gene("linear", {4: [0.1, 0.1, 0.1], 8: [0.1, 0.1, 0.1]})]
    block = solve_statistics(genes, [4, 8], 0.9, 0.95)
    result = {"knob": "pairs", "values": [4, 8], "solve": block, "genes": genes, "points": [], "seeds": [1, 2, 3],
              "confidence": 0.95}
    headers, rows, _ = solve_table(result)
    assert headers[-1] == "Solve rate < 0.5 at (range)"
    assert rows[0][2] == "3/3 [0.29, 1.00]" and rows[0][3].startswith(f"{BREAK_MARK} 1/3")
    assert rows[0][-1] == "pairs=8 (pairs=4 .. beyond the values)"  # 3/3 reaches down to 0.29 already
    assert rows[1][2].startswith(f"{BREAK_MARK} 0/3")
    # 3 seeds against 3 cannot decide at Holm's level of 2: said, no verdict shown
    assert genes[1]["points"][0]["solve_versus"]["cannot_decide"].startswith("3 against 3 seeds cannot decide")
    assert "Fisher's exact test, Holm over 2 comparisons" in curve_markdown({**result, "model": {}})
    assert solve_table({"genes": genes}) is None


def test_a_curve_with_a_solve_threshold(tmp_path, capsys):
    result = run_curve(Config(**TINY), "baseline,linear", "pairs", [2, 4], seeds=2, out_dir=tmp_path,
                       solve_threshold=0.9, solve_test="barnard", quiet=True)
    written = json.loads((tmp_path / "curve.json").read_text())
    assert written["solve"]["threshold"] == 0.9 and written["solve"]["test"] == "barnard"
    linear = written["genes"][1]
    assert all(r["solve"]["n"] == 2 for r in linear["points"]) and "solve_versus" in linear["points"][0]
    assert "## Solve rates" in (tmp_path / "curve.md").read_text()
    assert result.solve["family_size"] == 2
    out = tmp_path / "cli"
    assert main(["curve", "--genes", "baseline", "--data", DATA, "--knob", "pairs=2,4", "--solve-threshold", "0.9",
                 "--out", str(out)] + TINY_FLAGS) == 0
    assert "solve rate below one half at" in capsys.readouterr().err
    assert main(["curve", "--genes", "baseline", "--data", DATA, "--knob", "pairs=2,4", "--solve-threshold", "0.4",
                 "--out", str(tmp_path / "x")] + TINY_FLAGS) != 0
    assert "--solve-threshold 0.4 is at or below the no-recall level" in capsys.readouterr().err
