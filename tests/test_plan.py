"""A registered family: validate --plan FILE runs a study plan and refuses family changes after
results exist unless the plan records them as amendments with their time."""

import json
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from conftest import STUDY_FLAGS
from evo_attention.cli import main
from evo_attention.studies.plan import check_registration, load_plan
from evo_attention.util.errors import UserError

GATED = "dot|softmax|output_gate|fixed|bias|0.10"
SPARSE = "dot|sparsemax|none|fixed|bias|0.10"


def _write(path, **plan):
    path.write_text(yaml.safe_dump({"comparisons": [GATED], "margin": 0.02, "alpha": 0.05, "test": "rule",
                                    "seeds": 2, **plan}))
    return path


def test_a_plan_fixes_the_family_and_its_changes_need_an_amendment(tmp_path, capsys):
    plan, out = _write(tmp_path / "plan.yaml"), tmp_path / "out"
    assert main(["validate", "--plan", str(plan), *STUDY_FLAGS, "--out", str(out)]) == 0
    result = json.loads((out / "validation.json").read_text())
    assert [g["gene"] for g in result["genes"]] == [GATED]
    assert result["margin"] == 0.02 and result["confidence"] == pytest.approx(0.95) and len(result["seeds"]) == 2
    assert result["plan"]["family"]["comparisons"] == [GATED] and result["plan"]["amendments"] == []
    # the same plan again: the same family, nothing refused
    assert main(["validate", "--plan", str(plan), *STUDY_FLAGS, "--out", str(out)]) == 0
    # a changed margin without an amendment: refused before anything trains
    _write(plan, margin=0.01)
    assert main(["validate", "--plan", str(plan), *STUDY_FLAGS, "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert "only by a new amendment appended to the --plan file" in err
    # an amendment dated before the results it amends: refused
    _write(plan, amendments=[{"time": "2001-01-01T00:00:00+00:00", "reason": "tighter margin", "margin": 0.01}])
    assert main(["validate", "--plan", str(plan), *STUDY_FLAGS, "--out", str(out)]) != 0
    assert "must be dated between those results" in capsys.readouterr().err
    # the amendment with its time: accepted and recorded
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    _write(plan, amendments=[{"time": now, "reason": "tighter margin", "margin": 0.01}])
    assert main(["validate", "--plan", str(plan), *STUDY_FLAGS, "--out", str(out)]) == 0
    result = json.loads((out / "validation.json").read_text())
    assert result["margin"] == 0.01 and result["plan"]["amendments"][0]["reason"] == "tighter margin"
    # rewriting the registered family under the amendment: refused (the history is append-only)
    _write(plan, comparisons=[SPARSE], amendments=[{"time": now, "reason": "tighter margin", "margin": 0.01},
                                                   {"time": now, "reason": "another gene",
                                                    "comparisons": [GATED, SPARSE]}])
    assert main(["validate", "--plan", str(plan), *STUDY_FLAGS, "--out", str(out)]) != 0
    assert "earlier amendments and the registered family stay as they were" in capsys.readouterr().err


def test_a_plan_is_refused_where_results_were_made_without_one(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "validation.json").write_text(json.dumps({"genes": [], "created_at": "2025-01-01T00:00:00+00:00"}))
    with pytest.raises(UserError, match="made without a plan"):
        check_registration(load_plan(_write(tmp_path / "p.yaml")), out)
    assert main(["validate", "--plan", str(tmp_path / "p.yaml"), "--genes", GATED, *STUDY_FLAGS]) != 0
    assert "--plan names the genes it compares: drop --genes" in capsys.readouterr().err


def test_a_plans_result_is_never_replaced_by_a_validation_without_it(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    recorded = {"genes": [], "plan": {"name": "p1", "fingerprint": "x"}}
    (out / "validation.json").write_text(json.dumps(recorded))
    assert main(["validate", "--genes", SPARSE, "--seeds", "2", *STUDY_FLAGS, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds the result of the registered family 'p1': run it with its --plan" in err and "\n" not in err
    assert json.loads((out / "validation.json").read_text()) == recorded


@pytest.mark.parametrize("change, message", [
    ({"test": "welch"}, "test 'welch' is not known"),
    ({"margin": 0.7}, "margin 0.7 must be a number in"),
    ({"seeds": 1}, "seeds 1 must be a whole number >= 2"),
    ({"comparisons": []}, "comparisons must be a non-empty list"),
    ({"comparisons": ["dot|softmax|none|fixed|bias|0.10"]}, "other than the baseline"),
    ({"typo": 1}, "unknown key 'typo'"),
    ({"amendments": [{"margin": 0.01, "reason": "x"}]}, "amendment 1 needs its time and its reason"),
    ({"amendments": [{"time": "yesterday", "reason": "x"}]}, "amendment 1 has time 'yesterday'"),
    ({"amendments": 5}, "amendments 5 must be a list"),
    ({"amendments": [{"time": "2099-01-01T00:00:00+00:00", "reason": "x", "margin": 0.01}]}, "in the future"),
])
def test_bad_plans_are_refused_in_one_line(tmp_path, change, message):
    with pytest.raises(UserError, match=message) as err:
        load_plan(_write(tmp_path / "p.yaml", **change))
    assert err.value.settings == ("plan",)


def test_a_plan_file_with_a_key_twice_or_a_directory_is_refused(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(f"comparisons: [{GATED}]\nmargin: 0.02\nmargin: 0.05\nalpha: 0.05\ntest: rule\nseeds: 2\n")
    with pytest.raises(UserError, match="sets margin twice"):
        load_plan(path)
    with pytest.raises(UserError, match="is a directory"):
        load_plan(tmp_path)


def test_an_earlier_amendment_cannot_be_edited(tmp_path):
    out, now = tmp_path / "out", datetime.now(timezone.utc).isoformat(timespec="seconds")
    plan = _write(tmp_path / "p.yaml", amendments=[{"time": now, "reason": "tighter margin", "margin": 0.01}])
    out.mkdir()
    (out / "validation.json").write_text(json.dumps({"plan": load_plan(plan).record(), "created_at": now}))
    _write(plan, amendments=[{"time": now, "reason": "tighter margin, on second thought", "margin": 0.01}])
    with pytest.raises(UserError, match="earlier amendments stay as they were"):
        check_registration(load_plan(plan), out)


def test_a_plan_without_a_fixed_field_is_refused(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"comparisons": [GATED], "margin": 0.02, "alpha": 0.05, "test": "rule"}))
    with pytest.raises(UserError, match="names no seeds"):
        load_plan(path)


def test_amendments_apply_in_order_and_keep_their_times(tmp_path):
    later = datetime(2025, 6, 1, 12, tzinfo=timezone.utc)
    plan = load_plan(_write(tmp_path / "p.yaml", amendments=[
        {"time": later, "reason": "a", "comparisons": [GATED, SPARSE]},
        {"time": (later + timedelta(hours=1)).isoformat(), "reason": "b", "seeds": 4}]))
    assert plan.family(0)["comparisons"] == [GATED] and plan.family()["comparisons"] == [GATED, SPARSE]
    assert plan.family()["seeds"] == 4 and plan.amendments[0]["time"] == "2025-06-01T12:00:00+00:00"


# -- a curve's registered family ---------------------------------------------------------------------
CURVE_FLAGS = ["--data", "mqar:seq_len=16,vocab=16,train_examples=64,eval_examples=16", "--d-model", "16", "--heads",
               "2", "--layers", "1", "--ffn", "32", "--steps", "2", "--batch-size", "4", "--eval-batch-size", "16",
               "--quiet"]


def _write_curve(path, **plan):
    path.write_text(yaml.safe_dump({"genes": ["baseline", SPARSE], "knob": "pairs=2,4", "seeds": 2,
                                    "solve_threshold": 0.9, "alpha": 0.1, "test": "fisher", **plan}))
    return path


def test_a_curve_plan_fixes_its_family_and_its_changes_need_an_amendment(tmp_path, capsys):
    plan, out = _write_curve(tmp_path / "curve.yaml"), tmp_path / "out"
    assert main(["curve", "--plan", str(plan), *CURVE_FLAGS, "--out", str(out)]) == 0
    result = json.loads((out / "curve.json").read_text())
    assert [g["name"] for g in result["genes"]] == ["baseline", SPARSE] and result["values"] == [2, 4]
    assert len(result["seeds"]) == 2 and result["confidence"] == pytest.approx(0.9)
    assert result["solve"]["threshold"] == 0.9 and result["solve"]["alpha"] == pytest.approx(0.1)
    assert result["plan"]["family"]["knob"] == "pairs=2,4" and result["plan"]["amendments"] == []
    # another threshold without an amendment: refused before anything trains
    _write_curve(plan, solve_threshold=0.8)
    assert main(["curve", "--plan", str(plan), *CURVE_FLAGS, "--out", str(out)]) != 0
    assert "only by a new amendment appended to the --plan file" in capsys.readouterr().err
    # with a dated amendment: accepted and recorded (the trainings come from the curve's store)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    _write_curve(plan, amendments=[{"time": now, "reason": "a stricter solve", "solve_threshold": 0.95}])
    assert main(["curve", "--plan", str(plan), *CURVE_FLAGS, "--out", str(out)]) == 0
    result = json.loads((out / "curve.json").read_text())
    assert result["solve"]["threshold"] == 0.95 and result["plan"]["amendments"][0]["reason"] == "a stricter solve"
    # the plan names the genes and the knob: a flag for either is refused
    assert main(["curve", "--plan", str(plan), "--genes", "baseline,linear", *CURVE_FLAGS, "--out", str(out)]) != 0
    assert "--plan names the genes and the knob it sweeps: drop --genes" in capsys.readouterr().err
    assert main(["curve", *CURVE_FLAGS, "--out", str(out)]) != 0
    assert "curve needs --genes LIST and --knob" in capsys.readouterr().err
    # a curve without the plan into its out would replace the registered family's result: refused
    before = (out / "curve.json").read_text()
    assert main(["curve", "--genes", "baseline,linear", "--knob", "pairs=2,4", *CURVE_FLAGS, "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert "holds the result of the registered family" in err and "\n" not in err.strip()
    assert (out / "curve.json").read_text() == before


@pytest.mark.parametrize("change, words", [
    ({"genes": ["baseline"]}, "at least two names"),
    ({"knob": "pairs"}, "is not NAME=V1,V2"),
    ({"test": "rule"}, "use fisher, barnard"),
    ({"solve_threshold": 1.5}, "an accuracy in (0, 1]"),
    ({"margin": 0.01}, "unknown key 'margin': a curve plan holds"),
])
def test_bad_curve_plans_are_refused(tmp_path, change, words):
    with pytest.raises(UserError, match=None) as err:
        load_plan(_write_curve(tmp_path / "p.yaml", **change), study="curve")
    assert words in str(err.value) and err.value.settings == ("plan",)
    with pytest.raises(UserError, match="names no solve_threshold"):
        path = tmp_path / "q.yaml"
        path.write_text(yaml.safe_dump({"genes": ["baseline", SPARSE], "knob": "pairs=2,4", "seeds": 2, "alpha": 0.1,
                                        "test": "fisher"}))
        load_plan(path, study="curve")


@pytest.mark.parametrize("flags, says", [
    (["--seeds", "5"], "--plan fixes --seeds"),
    (["--margin", "5%"], "--plan fixes --margin"),
])
def test_flags_a_validation_plan_fixes_are_refused(tmp_path, capsys, flags, says):
    plan = _write(tmp_path / "p.yaml")
    assert main(["validate", "--plan", str(plan), *STUDY_FLAGS, *flags, "--out", str(tmp_path / "out")]) != 0
    assert says in capsys.readouterr().err and not (tmp_path / "out" / "validation.json").exists()


def test_a_curve_flag_that_needs_another_says_so(tmp_path, capsys):
    assert main(["curve", "--genes", "baseline", "--knob", "pairs=2,4", "--solve-test", "barnard", *CURVE_FLAGS,
                 "--out", str(tmp_path / "out")]) != 0
    assert "--solve-test compares solve rates, which need --solve-threshold" in capsys.readouterr().err
    plan = _write_curve(tmp_path / "c.yaml")
    assert main(["curve", "--plan", str(plan), "--seeds", "3", *CURVE_FLAGS, "--out", str(tmp_path / "o2")]) != 0
    assert "--plan fixes --seeds" in capsys.readouterr().err


def test_a_seed_block_past_a_64_bit_seed_is_refused(tmp_path, capsys):
    assert main(["validate", "--genes", GATED, "--seed-block", "9999999999999999", *STUDY_FLAGS,
                 "--out", str(tmp_path / "out")]) != 0
    assert "seed_block" in capsys.readouterr().err.replace("--seed-block", "seed_block")
