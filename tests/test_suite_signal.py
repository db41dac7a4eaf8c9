"""benchmarks/suite_signal.py: its smoke run trains the baseline on every point of mad-cpu and writes
each point's chance and no-recall levels, the baseline's mean, its flags and its signal over noise."""

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("suite_signal", REPO / "benchmarks" / "suite_signal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flags_place_the_baseline_between_the_levels():
    flags = load_script().flags
    inside = flags(0.6, 0.05, chance=0.1, no_recall=0.3)
    assert inside["in_band"] and not inside["saturated"] and not inside["at_chance"] and not inside["no_lookup"]
    assert inside["informative"]
    assert inside["signal_over_noise"] == pytest.approx((0.6 - 0.3) / 0.05)  # the floor is the no-recall level
    top = flags(0.95, 0.01, chance=0.1, no_recall=None)
    assert top["signal_over_noise"] == pytest.approx((0.98 - 0.95) / 0.01) and top["no_lookup"] is None
    assert top["informative"]
    assert flags(1.0, 0.0, chance=0.1, no_recall=None)["saturated"] is True
    assert flags(1.0, 0.0, chance=0.1, no_recall=None)["in_band"] is False
    assert flags(0.1, 0.01, chance=0.1, no_recall=None)["at_chance"] is True
    guess = flags(0.31, 0.02, chance=0.1, no_recall=0.3)  # the example's likeliest value: no lookup learned
    assert guess["no_lookup"] is True and guess["in_band"] and not guess["informative"]
    below = flags(0.25, None, chance=0.1, no_recall=0.3)
    assert below["no_lookup"] is True and below["headroom"] == pytest.approx(-0.05)
    assert flags(0.5, None, chance=0.1, no_recall=None)["signal_over_noise"] is None  # one seed: no sd
    assert flags(None, None, chance=0.1, no_recall=None)["in_band"] is False  # every seed failed


def test_smoke_run_writes_every_point(tmp_path, capsys):
    out = tmp_path / "signal.json"
    assert load_script().main(["--smoke", "--out", str(tmp_path / "runs"), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    from evo_attention.data.suites import load_suite

    suite = load_suite("mad-cpu")
    assert result["suite"] == "mad-cpu" and list(result["points"]) == list(suite.labels)
    assert result["smoke"] is True and result["seeds"] == [43] and result["baseline"] == "baseline"
    assert result["model"]["d_model"] == 16 and "--smoke" in result["command"]
    for label, point in result["points"].items():
        assert point["steps"] == 2 and point["suite_steps"] == suite.point(label).steps
        assert 0 < point["chance_accuracy"] < 1
        row = point["genes"]["baseline"]
        assert row["gene"].startswith("dot|softmax") and set(row["accuracy"]) == {"43"} and row["failed"] == 0
        b = point["baseline"]
        assert 0 <= b["mean"] <= 1 and b["sd"] is None and b["signal_over_noise"] is None
        assert b["in_band"] == (point["chance_accuracy"] < b["mean"] < 0.98)
    assert result["points"]["mqar"]["no_recall_accuracy"] == pytest.approx(0.33716, abs=1e-4)  # 4 of 16 values
    assert result["points"]["recall"]["no_recall_accuracy"] == pytest.approx(0.41211, abs=1e-4)  # 4 of 8
    assert result["points"]["selective-copy"]["no_recall_accuracy"] is None
    assert result["points_in_band"] == sum(p["baseline"]["in_band"] for p in result["points"].values())
    assert result["points_informative"] == sum(p["baseline"]["informative"] for p in result["points"].values())
    assert "points strictly between chance and 0.98" in capsys.readouterr().out
