"""Learning-rate schedules: constant, cosine and wsd (warm-up, stable, decay), the warm-up in steps
or as a fraction, their checks, and how they reach a trial's key and a record."""

import math
from pathlib import Path

import pytest

from evo_attention import Config
from evo_attention.cli import build_parser
from evo_attention.cli.common import config_from_args, user_message
from evo_attention.data import data_from_config
from evo_attention.train.config import describe_schedule
from evo_attention.train.presets import PRESETS, build_config, merged_settings, read_config_file
from evo_attention.train.schedules import SCHEDULES, Schedule, register_schedule, scheduled_rate
from evo_attention.train.spec import Trial, steps_of
from evo_attention.train.trainer import Trainer, train_and_evaluate

ROOT = Path(__file__).resolve().parents[1]
GENE = "dot|softmax|none|fixed"
TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 128, "eval_examples": 32},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=32, eval_steps=None,
            learning_rate=3e-3, train_steps=8, log_every=2)


def released_rate(recipe, step, total_steps):
    """``scheduled_rate`` as released before wsd, frozen here: stored results were trained at it."""
    if recipe.lr_schedule == "constant":
        return recipe.learning_rate
    if step < recipe.warmup_steps:
        return recipe.learning_rate * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, total_steps - recipe.warmup_steps)
    return recipe.learning_rate * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def context(config, **kw):
    return Trial.from_config(GENE, config, **kw).context


# -- the rates ------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:warmup.* does not apply to lr_schedule constant")  # set there on purpose
@pytest.mark.parametrize("changes", [{}, {"warmup_steps": 0}, {"warmup_steps": 37, "learning_rate": 2e-3},
                                     {"lr_schedule": "cosine"}, {"lr_schedule": "cosine", "warmup_steps": 0},
                                     {"lr_schedule": "cosine", "warmup_steps": 37, "learning_rate": 2e-3,
                                      "train_steps": 400}])
def test_constant_and_cosine_rates_are_the_released_ones_bit_for_bit(changes):
    recipe = Config(**changes).train
    total = Config(**changes).train_steps
    for step in list(range(0, 60)) + list(range(total - 60, total + 2)):
        assert scheduled_rate(recipe, step, total) == released_rate(recipe, step, total)


def test_cosine_rate_matches_its_formula():
    recipe = Config(learning_rate=2.0, warmup_steps=10, lr_schedule="cosine", train_steps=110).train
    assert scheduled_rate(recipe, 0, 110) == pytest.approx(0.2)  # warm-up start: lr * 1 / W
    assert scheduled_rate(recipe, 9, 110) == 2.0  # end of warm-up: the peak
    assert scheduled_rate(recipe, 10, 110) == 2.0  # the cosine starts at the peak
    assert scheduled_rate(recipe, 60, 110) == pytest.approx(1.0)  # half way down
    assert scheduled_rate(recipe, 109, 110) == pytest.approx(2.0 * 0.5 * (1 + math.cos(math.pi * 99 / 100)))
    assert scheduled_rate(recipe, 110, 110) == pytest.approx(0.0, abs=1e-12)


def test_constant_rate_ignores_the_warmup():
    recipe = Config(learning_rate=0.5, warmup_steps=500, train_steps=400).train
    assert {scheduled_rate(recipe, step, 400) for step in range(401)} == {0.5}


def test_a_warmup_the_schedule_ignores_is_said_where_given_in_python_and_keeps_its_key():
    import re
    import warnings

    said = "warmup_steps does not apply to lr_schedule constant (it has no warm-up): leave it out or choose"
    with pytest.warns(UserWarning, match="^" + re.escape(said)):
        config = Config(warmup_steps=10)
    with pytest.warns(UserWarning, match="^warmup does not apply to lr_schedule constant"):
        Config(warmup=0.05)
    with pytest.warns(UserWarning, match="^" + re.escape(said)):
        Config().replace(warmup_steps=20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said nowhere else: no warm-up, one that applies, one a preset or store keeps
        Config(), Config(warmup_steps=0), Config(lr_schedule="cosine", warmup_steps=10), config.replace(train_steps=9)
        preset = build_config("shakespeare-char", overrides={"lr_schedule": "constant"})
        assert preset.warmup_steps == 50 and preset.replace(seed=1).warmup_steps == 50
        stored = Config.from_dict(config.to_dict())
    assert context(stored) == context(config) != context(Config())  # the key is the one it had


def test_wsd_rate_matches_its_formula():
    # lr 2, W = 10 warm-up steps, T = 100, D = 0.2 * 100 = 20 decay steps from step 80
    recipe = Config(learning_rate=2.0, warmup_steps=10, lr_schedule="wsd", lr_decay_fraction=0.2,
                    train_steps=100).train
    rate = [scheduled_rate(recipe, step, 100) for step in range(101)]
    assert rate[0] == pytest.approx(0.2)  # warm-up start: lr * (0 + 1) / W
    assert rate[4] == pytest.approx(1.0)
    assert rate[9] == 2.0  # end of warm-up: the peak
    assert rate[10] == rate[45] == rate[79] == 2.0  # stable
    assert rate[80] == 2.0  # start of decay: lr * (T - step) / D = lr * 20 / 20
    assert rate[90] == 1.0
    assert rate[99] == pytest.approx(0.1)  # the last trained step: lr / D
    assert rate[100] == 0.0
    assert all(a >= b for a, b in zip(rate[9:], rate[10:]))  # never rises after the warm-up
    for step in range(101):  # the closed form: lr * min(1, (step + 1) / W, (T - step) / D)
        assert rate[step] == pytest.approx(2.0 * min(1.0, (step + 1) / 10, (100 - step) / 20))


def test_wsd_decay_is_whole_steps_rounded_half_up():
    assert [steps_of(f, 10) for f in (0.0, 0.04, 0.05, 0.25, 0.29, 1.0)] == [0, 0, 1, 3, 3, 10]
    assert steps_of(0.05, 400) == 20 and steps_of(0.29, 100) == 29 and steps_of(0.07, 100) == 7
    recipe = Config(learning_rate=1.0, warmup_steps=2, lr_schedule="wsd", lr_decay_fraction=0.25, train_steps=10).train
    assert recipe.decay_steps(10) == 3
    assert [scheduled_rate(recipe, s, 10) for s in range(10)] == pytest.approx(
        [0.5, 1, 1, 1, 1, 1, 1, 1, 2 / 3, 1 / 3])


def test_wsd_without_decay_or_warmup():
    flat = Config(learning_rate=1.0, warmup_steps=4, lr_schedule="wsd", lr_decay_fraction=0.0, train_steps=20).train
    assert [scheduled_rate(flat, s, 20) for s in range(20)] == [0.25, 0.5, 0.75] + [1.0] * 17
    straight = Config(learning_rate=1.0, warmup_steps=0, lr_schedule="wsd", lr_decay_fraction=1.0, train_steps=4).train
    assert [scheduled_rate(straight, s, 4) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]


# -- the checks -----------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_a_warmup_as_long_as_the_training_is_refused_naming_both_numbers(schedule):
    with pytest.raises(ValueError, match=r"warmup_steps 500 >= train_steps 400: .*never end"):
        Config(lr_schedule=schedule, train_steps=400)
    with pytest.raises(ValueError, match=r"warmup_steps 400 >= train_steps 400"):
        Config(lr_schedule=schedule, train_steps=400, warmup_steps=400)
    with pytest.raises(ValueError, match=r"warmup 0.999 \(400 steps\) >= train_steps 400"):
        Config(lr_schedule=schedule, train_steps=400, warmup=0.999)
    assert Config(lr_schedule=schedule, train_steps=400, warmup_steps=20).train.warmup_steps == 20


def test_a_constant_schedule_accepts_any_warmup():
    assert Config(train_steps=400).warmup_steps == 500  # the quick preset's case: the warm-up is unused
    with pytest.warns(UserWarning, match="^warmup_steps does not apply to lr_schedule constant"):  # said unused
        assert Config(train_steps=400, warmup_steps=4000).lr_schedule == "constant"


def test_wsd_warmup_and_decay_must_not_overlap():
    Config(lr_schedule="wsd", train_steps=100, warmup_steps=80, lr_decay_fraction=0.2)  # no stable phase: allowed
    with pytest.raises(ValueError, match=r"warmup_steps 81 \+ 20 decay steps \(lr_decay_fraction 0.2 of 100\) > "
                                         r"train_steps 100"):
        Config(lr_schedule="wsd", train_steps=100, warmup_steps=81, lr_decay_fraction=0.2)
    Config(lr_schedule="cosine", train_steps=100, warmup_steps=81, lr_decay_fraction=0.2)  # cosine has no decay part


@pytest.mark.parametrize("kwargs, words", [({"warmup": 1.0}, "warmup must be a fraction"),
                                           ({"warmup": -0.1}, "warmup must be a fraction"),
                                           ({"warmup": "5%"}, "warmup must be a fraction"),
                                           ({"lr_decay_fraction": 1.5}, "lr_decay_fraction"),
                                           ({"lr_decay_fraction": -0.1}, "lr_decay_fraction"),
                                           ({"lr_schedule": "linear"}, "valid options are constant, cosine, wsd")])
def test_bad_schedule_values_are_named(kwargs, words):
    with pytest.raises(ValueError, match=words):
        Config(**kwargs)


def test_warmup_steps_and_fraction_are_exclusive():
    with pytest.raises(ValueError, match="warmup 0.05 and warmup_steps 20 both set the warm-up"):
        Config(warmup=0.05, warmup_steps=20)
    with pytest.raises(ValueError, match="warmup 0.05 and warmup_steps 500 both set the warm-up"):
        build_config(overrides={"warmup": 0.05, "warmup_steps": 500})  # one layer giving both
    args = build_parser().parse_args(["validate", "--genes", GENE, "--warmup-fraction", "0.05", "--warmup-steps", "20"])
    with pytest.raises(ValueError) as caught:
        config_from_args(args)
    assert user_message(caught.value).startswith("--warmup-fraction 0.05 and --warmup-steps 20 both set the warm-up")


def test_a_later_layer_replaces_the_warmup_in_either_form(tmp_path):
    # the shakespeare-char preset gives warmup_steps 50: a fraction from the command line replaces it
    args = build_parser().parse_args(["validate", "--genes", GENE, "--preset", "shakespeare-char",
                                      "--warmup-fraction", "0.1"])
    config = config_from_args(args)
    assert (config.warmup, config.warmup_steps, config.train.warmup_steps) == (0.1, 500, 60)
    path = tmp_path / "c.yaml"
    path.write_text("lr_schedule: wsd\nwarmup: 0.05\ntrain_steps: 400\n")
    assert merged_settings(None, path, {"warmup_steps": 30}) == {"lr_schedule": "wsd", "train_steps": 400,
                                                                 "warmup_steps": 30}
    assert build_config(None, path).train.warmup_steps == 20


def test_a_dumped_config_with_a_warmup_fraction_reads_back(tmp_path):
    import yaml

    config = Config(lr_schedule="cosine", train_steps=40, warmup=0.1)
    path = tmp_path / "dumped.yaml"
    path.write_text(yaml.safe_dump(config.to_dict()))
    assert build_config(None, path).train == config.train == Config.from_dict(read_config_file(path)).train
    path.write_text("warmup: 0.1\nwarmup_steps: 20\n")
    with pytest.raises(ValueError, match="warmup 0.1 and warmup_steps 20 both set the warm-up"):
        build_config(None, path)


def test_every_preset_benchmark_and_documented_schedule_constructs():
    for name in PRESETS:
        build_config(name)
    for path in (ROOT / "benchmarks").glob("*.yaml"):
        build_config("quick", path)
        Config.from_dict(read_config_file(path))
    build_config("shakespeare-char", overrides={"train_steps": 300, "tokenizer": "byte"})  # docs/data.md
    build_config("quick", overrides={"lr_schedule": "wsd", "warmup": 0.05})  # docs/search.md
    build_config("quick", overrides={"lr_schedule": "cosine", "warmup_steps": 20})


def test_schedule_flags_reach_the_config():
    args = build_parser().parse_args(["validate", "--genes", GENE, "--preset", "quick", "--lr-schedule", "wsd",
                                      "--decay-fraction", "0.3", "--warmup-fraction", "0.05"])
    config = config_from_args(args)
    assert (config.lr_schedule, config.lr_decay_fraction, config.warmup) == ("wsd", 0.3, 0.05)
    assert (config.train.warmup_steps, config.train.decay_steps(400)) == (20, 120)
    args = build_parser().parse_args(["validate", "--genes", GENE, "--preset", "quick", "--lr-schedule", "cosine"])
    with pytest.raises(ValueError) as caught:
        config_from_args(args)
    message = user_message(caught.value)  # a setting from the preset is named by its key and source
    assert message.startswith("--warmup-steps 500 >= train_steps 400") and "(train_steps is set in preset quick)" in message


# -- keys and records -----------------------------------------------------------------------------
def test_an_old_config_keeps_its_key():
    assert context(Config()) == "3fe7a76cab98488e"
    assert context(Config(lr_decay_fraction=0.2, warmup=None)) == "3fe7a76cab98488e"
    assert "lr_decay_fraction" not in Trial.from_config(GENE, Config(lr_schedule="cosine")).settings()


@pytest.mark.filterwarnings("ignore:warmup.* does not apply to lr_schedule constant")  # set there on purpose
def test_a_warmup_fraction_is_the_steps_it_resolves_to():
    for schedule in ("constant", "cosine", "wsd"):
        base = Config(lr_schedule=schedule, train_steps=400, warmup_steps=10)
        by_fraction = base.replace(warmup=0.05)  # replaces the warm-up given in steps
        assert by_fraction.train == base.replace(warmup_steps=20).train
        assert context(by_fraction) == context(base.replace(warmup_steps=20)) != context(base.replace(warmup_steps=21))
    # the fraction follows the steps: of the budget for a partial training, of a replaced train_steps
    config = Config(lr_schedule="wsd", warmup=0.05, train_steps=400)
    assert Trial.from_config(GENE, config, steps=100, budget=400).train.warmup_steps == 20
    assert Trial.from_config(GENE, config, steps=200).train.warmup_steps == 10
    assert config.replace(train_steps=1000).train.warmup_steps == 50
    assert (config.replace(warmup_steps=30).warmup, config.replace(warmup_steps=30).train.warmup_steps) == (None, 30)


def test_the_decay_fraction_joins_the_key_only_under_wsd():
    for schedule in ("constant", "cosine"):
        base = Config(lr_schedule=schedule)
        assert context(base.replace(lr_decay_fraction=0.3)) == context(base)
        assert base.replace(lr_decay_fraction=0.3).train == base.train
    wsd = Config(lr_schedule="wsd")
    assert len({context(wsd), context(wsd.replace(lr_decay_fraction=0.3)), context(wsd.replace(lr_decay_fraction=0.1)),
                context(Config(lr_schedule="cosine"))}) == 4
    # a rung of a decaying schedule is not a plain training of its steps: the budget joins its key
    assert context(wsd, steps=1000, budget=5000).endswith("~5000")


def test_a_record_says_the_schedule_it_ran_with():
    settings = Trial.from_config(GENE, Config(lr_schedule="wsd", warmup=0.05, train_steps=400)).record_settings()
    assert (settings["lr_schedule"], settings["warmup_steps"], settings["lr_decay_fraction"]) == ("wsd", 20, 0.2)
    settings = Trial.from_config(GENE, Config(lr_schedule="cosine", lr_decay_fraction=0.5)).record_settings()
    assert (settings["lr_schedule"], settings["warmup_steps"]) == ("cosine", 500) and "lr_decay_fraction" not in settings
    settings = Trial.from_config(GENE, Config(train_steps=40)).record_settings()  # constant: no warm-up ran
    assert (settings["lr_schedule"], settings["warmup_steps"]) == ("constant", 0)
    assert Trial.from_config(GENE, Config(train_steps=40)).settings()["warmup_steps"] == 500  # the key's, unchanged


def test_a_wsd_training_runs_its_schedule_and_stores_it():
    config = Config(**TINY, lr_schedule="wsd", warmup=0.25, lr_decay_fraction=0.5)  # W = 2, D = 4 of 8 steps
    data = data_from_config(config)
    trainer = Trainer.from_config(GENE, config, data)
    assert [trainer.lr_at(s) / 3e-3 for s in range(8)] == pytest.approx([0.5, 1, 1, 1, 1, 0.75, 0.5, 0.25])
    record = train_and_evaluate(GENE, config, data)
    assert record.ok and record.settings["warmup_steps"] == 2 and record.settings["lr_decay_fraction"] == 0.5
    assert Config.from_dict(Trial.from_config(GENE, config).config_dict()).train == config.train  # a saved model's
    partial = Trainer(Trial.from_config(GENE, config.replace(train_steps=4), steps=4, budget=8, data=data), data)
    assert partial.train_steps == 8 and partial.lr_at(3) == trainer.lr_at(3)  # the schedule spans the budget


def test_describe_schedule():
    assert describe_schedule(Config()) == "lr 0.0003, constant"
    assert describe_schedule(PRESETS["shakespeare-char"]) == (
        "lr 0.002, cosine: linear warm-up over 50 steps, cosine decay to 0 at step 600")
    wsd = Config(lr_schedule="wsd", warmup=0.05, train_steps=400, learning_rate=2e-3)
    assert describe_schedule(wsd.to_dict()) == (
        "lr 0.002, wsd: linear warm-up over 20 steps (0.05 of 400), stable to step 320, linear decay to 0 over the "
        "last 80 steps (decay fraction 0.2)")
    record_settings = Trial.from_config(GENE, wsd).record_settings()
    assert describe_schedule(record_settings, 400) == (
        "lr 0.002, wsd: linear warm-up over 20 steps, stable to step 320, linear decay to 0 over the last 80 steps "
        "(decay fraction 0.2)")


def test_a_schedule_is_one_table_entry(capsys):
    """A linear decay to 0 after the warm-up, added at run time: the Config takes it, its rate is the
    entry's, the words and the flag's help name it, a warm-up must fit it; then it is removed."""
    def linear(recipe, step, total_steps):
        return recipe.learning_rate * max(0, total_steps - step) / max(1, total_steps - recipe.warmup_steps)

    register_schedule("linear", Schedule(linear, "linear warm-up, then a linear decay to 0",
                                         words=lambda steps, _: f"linear decay to 0 at step {steps}"))
    try:
        config = Config(learning_rate=1.0, lr_schedule="linear", warmup_steps=2, train_steps=10)
        recipe = config.train
        assert [scheduled_rate(recipe, s, 10) for s in range(11)] == pytest.approx(
            [0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0])
        assert describe_schedule(config) == "lr 1, linear: linear warm-up over 2 steps, linear decay to 0 at step 10"
        with pytest.raises(SystemExit):
            build_parser().parse_args(["validate", "--help"])
        shown = "".join(capsys.readouterr().out.split())  # argparse wraps the help at spaces and hyphens
        assert "".join("{constant,cosine,wsd,linear} constant (the original's; no warm-up), cosine (linear warm-up, "
                       "then a cosine decay to 0), wsd (linear warm-up, stable, then a linear decay to 0 over the "
                       "last --decay-fraction of the steps) or linear (linear warm-up, then a linear decay to "
                       "0)".split()) in shown
        assert "".join("--warmup-steps N linear warm-up steps of --lr-schedule cosine, wsd or linear".split()) in shown
        args = build_parser().parse_args(["validate", "--genes", GENE, "--lr-schedule", "linear", "--steps", "10",
                                          "--warmup-steps", "2"])
        assert config_from_args(args).lr_schedule == "linear"
        with pytest.raises(Exception, match="linear schedule's warm-up would never end"):
            Config(lr_schedule="linear", warmup_steps=10, train_steps=10)
        assert "lr_decay_fraction" not in Trial.from_config(GENE, config.replace(lr_decay_fraction=0.5)).settings()
    finally:
        SCHEDULES.pop("linear")
    with pytest.raises(Exception, match="unknown lr_schedule 'linear': valid options are constant, cosine, wsd"):
        Config(lr_schedule="linear")
