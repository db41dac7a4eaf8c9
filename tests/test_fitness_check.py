"""The fitness check (studies.fitness, evo-attention fitness-check): its statistics, a planted
improvement found end to end, a saturated fitness reported as such, and the search's verdict line."""

import json

import pytest

from evo_attention.cli import main
from evo_attention.report.studies.fitness import improvement_verdict, points_verdict
from evo_attention.studies.fitness import (CEILING, Improvement, known_improvements, parse_improvement, point_row,
                                           ranking, run_fitness_check)
from evo_attention.train.presets import build_config
from evo_attention.util.errors import UserError

TINY = ["--preset", "quick", "--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32", "--steps", "10",
        "--batch-size", "8", "--eval-batch-size", "16", "--eval-steps", "2", "--quiet"]
VANILLA = "dot|softmax|none|fixed|bias|0.10"
FROZEN = VANILLA + "|lr=1e-09"  # the vanilla gene that cannot learn: a planted, certain loss


def tiny(**changes):
    return build_config("quick", overrides={"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "train_steps": 10,
                                            "batch_size": 8, "eval_batch_size": 16, "eval_steps": 2,
                                            "learning_rate": 1e-2, **changes})


# -- the statistics --------------------------------------------------------------------------------
def test_ranking_of_a_clear_effect_is_near_certain_and_reversed_is_wrong_way_round():
    better = [0.80, 0.82, 0.79, 0.81, 0.83]
    worse = [0.60, 0.62, 0.58, 0.61, 0.63]
    row = ranking(better, worse, lower_is_better=False, evaluations=(1, 3))
    assert row["p_one"] > 0.999 and row["seeds_ranked_right"] == 5 and row["evaluations_to_see"] == 1
    assert row["effect"] == pytest.approx(0.202) and row["effect_sd"] > 10
    flipped = ranking(worse, better, lower_is_better=False, evaluations=(1,))
    assert flipped["p_one"] < 0.001 and flipped["effect"] < 0
    assert "wrong way round" in improvement_verdict({"name": "x", **flipped}, (1,))
    # a loss: lower is better, so the same numbers read the other way
    assert ranking(worse, better, lower_is_better=True, evaluations=(1,))["p_one"] > 0.999


def test_ranking_of_a_small_effect_needs_several_evaluations():
    better = [1.0, 1.3, 0.8, 1.2, 0.9, 1.1, 1.0, 1.2]
    worse = [0.9, 1.0, 1.0, 1.0, 0.7, 1.1, 1.0, 0.95]
    row = ranking(better, worse, lower_is_better=False, evaluations=(1, 2, 4))
    assert 0.5 < row["p_one"] < 0.9
    assert row["p_by_evaluations"]["1"] < row["p_by_evaluations"]["2"] < row["p_by_evaluations"]["4"]
    assert row["evaluations_to_see"] > 1
    # the reported probability is the lower of the paired and unpaired models
    assert row["p_one"] == pytest.approx(min(row["p_paired"], row["p_unpaired"]))
    assert "cannot reliably see" in improvement_verdict({"name": "x", **row}, (1,))


def test_ranking_without_spread_and_with_failures():
    same = ranking([1.0, 1.0], [1.0, 1.0], lower_is_better=False, evaluations=(1,))
    assert same["p_one"] == 0.5 and same["effect_sd"] is None
    solved = ranking([1.0, 1.0, 1.0], [0.5, 0.5, 0.5], lower_is_better=False, evaluations=(1,))
    assert solved["p_one"] == 1.0
    few = ranking([1.0, None], [0.5, 0.4], lower_is_better=False, evaluations=(1,))
    assert few["p_one"] is None and "too few" in improvement_verdict({"name": "x", **few}, (1,))


def test_point_status_saturated_floor_and_headroom():
    assert point_row([0.99, 1.0, 0.985], 0.1, 0.4, True)["status"] == "saturated"
    assert point_row([0.99, 1.0, 0.985], 0.1, 0.4, True)["saturated_share"] == 1.0
    assert point_row([0.41, 0.40, 0.42], 0.1, 0.4, True)["status"] == "no lookup"
    assert point_row([0.96, 0.97, 0.96], 0.1, 0.4, True)["status"] == "near ceiling"
    row = point_row([0.6, 0.7, 0.99], 0.1, 0.4, True)
    assert row["status"] == "headroom" and row["saturated_share"] == pytest.approx(1 / 3)
    assert point_row([4.1, 4.2], None, None, False)["status"] is None


def test_a_saturated_fitness_is_reported_as_such():
    points = {label: {**point_row([1.0, 0.99, 1.0], 0.06, 0.3, True), "variance_share": 0.5}
              for label in ("recall", "mqar")}
    result = {"lr": 0.004, "points": points, "saturated": True, "ceiling": CEILING, "headroom_ceiling": 0.95}
    assert "saturated" in points_verdict(result)
    result["saturated"] = False
    result["points"]["mqar"] = point_row([0.6, 0.7], 0.06, 0.3, True)
    assert "saturated on recall" in points_verdict(result) and "1 of 2 points with headroom" in points_verdict(result)


# -- improvements ------------------------------------------------------------------------------------
def test_default_improvements_follow_the_fitness():
    language = known_improvements(tiny(data="wikitext2"))
    assert [i.name for i in language] == ["output gate"] and "output_gate" in language[0].better
    task = known_improvements(tiny(data="mqar:seq_len=16,vocab=16,pairs=2"))
    assert [i.name for i in task] == ["dconv=3", "softmax over linear"]
    assert task[1].worse.startswith("dot|linear|") and task[1].better.endswith("|0.00")
    with_conv = known_improvements(tiny(data="mqar:seq_len=16,vocab=16,pairs=2", short_conv=3))
    assert [i.name for i in with_conv] == ["softmax over linear"]  # a short convolution already mixes tokens


def test_parse_improvement_forms_and_refusals():
    config = tiny()
    assert parse_improvement("output gate", config, language=True).name == "output gate"
    mine = parse_improvement(f"slow={VANILLA}>{FROZEN}", config)
    assert mine == Improvement("slow", VANILLA, FROZEN)
    assert parse_improvement("rope=rope_only", config).worse == config.resolved_baseline().key
    for bad in ("nonsense", "=dot|softmax|none|fixed", "x=no_such_config"):
        with pytest.raises(UserError):
            parse_improvement(bad, config)


# -- end to end --------------------------------------------------------------------------------------
def test_a_planted_improvement_is_found_and_the_rate_is_tuned(tmp_path):
    import evo_attention

    assert evo_attention.run_fitness_check is run_fitness_check  # the Python API's front door
    planted = Improvement("learning at all", VANILLA, FROZEN)
    result = run_fitness_check(tiny(), seeds=3, lr_grid=(1e-3, 1e-2), n_tuning_seeds=1, improvements=[planted],
                               evaluations=(1, 2), out_dir=tmp_path)
    assert result["grid"]["selected"] == 1e-2 and result["lr"] == 1e-2 and result["grid"]["at_edge"]
    (row,) = result["improvements"]
    assert row["effect"] > 0 and row["p_one"] > 0.9 and row["seeds_ranked_right"] == 3
    assert "can see learning at all in one evaluation" in result.verdicts[1]
    written = json.loads((tmp_path / "fitness_check.json").read_text())
    assert written["fitness"]["metric"] == "val_loss" and written["seeds"] == [43, 44, 45]
    assert "## Known improvements" in (tmp_path / "fitness_check.md").read_text()
    (point,) = written["points"].values()  # one point carries all the variance there is
    assert point["variance_share"] == (1.0 if point["sd"] else None) and point["metric"] == "accuracy"
    # a repeat trains nothing: every training is in the check's store
    again = run_fitness_check(tiny(), seeds=3, lr_grid=(1e-3, 1e-2), n_tuning_seeds=1, improvements=[planted],
                              evaluations=(1, 2), out_dir=tmp_path)
    assert again["improvements"] == result["improvements"]


def test_cli_check_then_search_prints_its_verdict(tmp_path, capsys):
    out = tmp_path / "check"
    improvement = f"learning at all={VANILLA}>{FROZEN}"
    assert main(["fitness-check", *TINY, "--lr", "0.01", "--seeds", "2", "--improvement", improvement,
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "can see learning at all" in printed and (out / "fitness_check.json").is_file()
    (point,) = json.loads((out / "fitness_check.json").read_text())["points"].values()
    assert point["eval_tokens"] > 0 and point["eval_complete"] is False  # eval_steps 2 scores part of the split
    assert f"measured on {point['eval_tokens']} of the" in (out / "fitness_check.md").read_text()
    run = tmp_path / "run"
    loud = [flag for flag in TINY if flag != "--quiet"]  # the verdict is a progress line
    assert main(["search", *loud, "--lr", "0.01", "--population", "3", "--generations", "1", "--elite", "1",
                 "--out", str(run)]) == 0
    assert "fitness check (2 seeds): this fitness can see learning at all" in capsys.readouterr().err
    with pytest.warns(UserWarning, match=r"made at another rate than this run's \(0.02\)"):
        assert main(["search", *loud, "--lr", "0.02", "--population", "3", "--generations", "1", "--elite", "1",
                     "--out", str(tmp_path / "other-rate")]) == 0


@pytest.mark.parametrize("flags, message", [
    (["--seeds", "1"], "--seeds must be at least 2"),
    (["--evaluations", "0,2"], "not a list of positive integers"),
    (["--evaluations", "1,3,1"], "names a number twice"),
    (["--improvement", "no-such-thing"], "is not a known one here"),
    (["--improvement", "x=not_a_config"], "unknown configuration"),
    (["--improvement", f"a={VANILLA}|dconv=2", "--improvement", "a=dot|softmax|output_gate|fixed|bias|0.10"],
     "improvement 'a' is named twice"),
])
def test_cli_bad_input_is_one_line(tmp_path, capsys, flags, message):
    code = None
    try:
        code = main(["fitness-check", *TINY, *flags, "--out", str(tmp_path / "o")])
    except SystemExit as exc:  # argparse's own refusals exit 2
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# -- the committed checks of the fitness presets ------------------------------------------------------
def test_the_committed_recall_check_is_the_check_of_its_preset_and_meets_its_targets():
    from evo_attention.studies.fitness import COMMITTED, Fitness, check_lines, fitness_id
    from evo_attention.data.suites import load_suite

    found = json.loads((COMMITTED / "fitness-recall.json").read_text())
    config = build_config("quick", overrides={"suite": "fitness-recall"})
    assert fitness_id(Fitness.of(config, suite=load_suite("fitness-recall"))) == found["fitness"]["id"]
    assert found["lr"] == config.learning_rate and len(found["seeds"]) >= 10
    assert all(p["no_recall"] < p["mean"] <= 0.95 and p["variance_share"] < 0.75 for p in found["points"].values())
    assert all(row["p_one"] >= 0.9 for row in found["improvements"])  # dconv=3, and softmax over linear
    assert any("can see dconv=3 in one evaluation" in line for line, _ in check_lines(config))


def test_the_committed_language_check_is_the_check_of_its_preset(monkeypatch):
    from tests.conftest import REPO
    from evo_attention.studies.fitness import COMMITTED, Fitness, fitness_id

    shakespeare = REPO.parent / "shared" / "data" / "shakespeare"
    if not (shakespeare / "valid.txt").exists():
        pytest.skip(f"shared Shakespeare corpus not found at {shakespeare}")
    found = json.loads((COMMITTED / "fitness-lm.json").read_text())
    config = build_config("fitness-lm", overrides={"data_dir": str(shakespeare)})
    assert fitness_id(Fitness.of(config)) == found["fitness"]["id"] and found["lr"] == config.learning_rate
    (gate,) = found["improvements"]
    assert gate["name"] == "output gate" and gate["p_one"] >= 0.9 and len(found["seeds"]) >= 10
