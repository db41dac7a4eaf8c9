from pathlib import Path

import pytest

from evo_attention import Config


def test_defaults_match_the_original():
    c = Config()
    assert (c.vocab_size, c.d_model, c.n_heads, c.n_layers, c.max_seq_len, c.dropout) == (10000, 128, 4, 2, 128, 0.1)
    assert (c.batch_size, c.eval_batch_size, c.learning_rate, c.train_steps, c.eval_steps, c.warmup_steps) == (
        32, 64, 3e-4, 5000, 200, 500)
    assert (c.population_size, c.n_generations, c.elite_size, c.mutation_rate, c.seed) == (12, 10, 3, 0.3, 42)
    assert c.ffn_dim == 512


def test_construction_has_no_side_effects(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Config()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"d_model": 130, "n_heads": 4}, "not divisible"),
        ({"n_layers": 0}, "n_layers"),
        ({"batch_size": -1}, "batch_size"),
        ({"vocab_size": 1}, "at least 2"),
        ({"dropout": 1.5}, "dropout"),
        ({"mutation_rate": 2}, "mutation_rate"),
        ({"learning_rate": 0}, "learning_rate"),
        ({"lr_schedule": "linear"}, "lr_schedule"),
        ({"data": "wiki"}, "valid options are wikitext2, text, recall"),
        ({"train_steps": 2.5}, "train_steps"),
    ],
)
def test_invalid_values_raise_clear_errors(kwargs, words):
    with pytest.raises(ValueError, match=words):
        Config(**kwargs)


def test_from_dict_names_an_unknown_key():
    with pytest.raises(ValueError, match="unknown key 'populaton_size'.*did you mean 'population_size'"):
        Config.from_dict({"populaton_size": 4})
    assert Config.from_dict({"d_model": 64}).d_model == 64
    assert Config.from_dict(Config().to_dict()) == Config()


@pytest.mark.parametrize("value,expected", [("all", None), ("7", 7)])
def test_eval_steps_flag_takes_all_for_the_whole_split(value, expected):
    from evo_attention.cli import build_parser
    from evo_attention.cli.common import config_from_args

    small = Path(__file__).resolve().parents[1] / "benchmarks" / "wikitext_small.yaml"
    args = build_parser().parse_args(["validate", "--config", str(small), "--eval-steps", value,
                                      "--genes", "dot|softmax|none|fixed"])
    assert config_from_args(args).eval_steps == expected  # the file says 10: the flag overrides it, 'all' too


def test_eval_steps_flag_names_a_bad_value(capsys):
    from evo_attention.cli import main

    with pytest.raises(SystemExit):
        main(["validate", "--eval-steps", "most"])
    assert "eval steps 'most' is not an integer (or 'all')" in capsys.readouterr().err


def test_task_options_belong_to_their_dataset():
    """The quick preset's recall options are dropped when another dataset is named (they would be
    unknown knobs of it), kept when the same dataset is named, and a layer's own options win."""
    from evo_attention.train.presets import merged_settings

    assert "recall" not in merged_settings("quick", None, {"data": "mad:in_context_recall"})
    assert merged_settings("quick", None, {"data": "recall"})["recall"]["num_pairs"] == 4
    own = merged_settings("quick", None, {"data": "mqar", "recall": {"pairs": 8}})
    assert own["recall"] == {"pairs": 8}


def test_a_config_files_task_options_reach_the_flags_task(tmp_path):
    """A file's task options are kept when --data names the same task (inline knobs win per key),
    refused in one line when it names another."""
    from evo_attention.train.presets import merged_settings
    from evo_attention.util.errors import UserError

    (tmp_path / "any.yaml").write_text("recall: {num_pairs: 2}\n")
    assert merged_settings(None, tmp_path / "any.yaml", {"data": "recall"})["recall"] == {"num_pairs": 2}
    (tmp_path / "mqar.yaml").write_text("data: mqar\nrecall: {pairs: 2, vocab: 16}\n")
    assert merged_settings(None, tmp_path / "mqar.yaml", {"data": "mqar:vocab=32"})["recall"] == {"pairs": 2}
    with pytest.raises(UserError, match="gives task options .* for data mqar, not for data recall"):
        merged_settings(None, tmp_path / "mqar.yaml", {"data": "recall"})


def test_a_preset_never_drops_its_example_counts_silently(capsys):
    """The quick preset's options (20000 train examples) belong to its recall data: a generated task
    named instead uses its own counts, and the command says so in one line."""
    from evo_attention.cli import build_parser
    from evo_attention.cli.common import config_from_args
    from evo_attention.train.presets import example_counts_note

    note = example_counts_note("quick", {"data": "mqar:seq_len=64"})
    assert "\n" not in note and "mqar:seq_len=64 trains on 10000 examples and evaluates 1000" in note
    assert "train_examples 20000" in note and "mqar:train_examples=" in note
    partly = example_counts_note("quick", {"data": "mad:compression:train_examples=500", "recall": {"seed": 1}})
    assert "trains on 500 examples and evaluates 1000" in partly
    assert "trains on fresh examples every step" in example_counts_note("quick", {"data": "mqar:train_examples=0"})
    assert example_counts_note("quick", {"data": "mqar:train_examples=5,eval_examples=5"}) is None  # its own
    assert example_counts_note("quick", {"data": "mqar", "recall": {"train_examples": 5, "eval_examples": 5}}) is None
    assert example_counts_note("quick", {"data": "recall"}) is None  # the preset's own data keeps them
    assert example_counts_note("quick", {"data": "wikitext2"}) is None  # no example counts there
    assert example_counts_note(None, {"data": "mqar"}) is None
    args = build_parser().parse_args(["validate", "--preset", "quick", "--data", "mqar:vocab=32",
                                      "--genes", "dot|softmax|none|fixed"])
    config = config_from_args(args)
    err = capsys.readouterr().err
    assert "note: mqar:vocab=32 trains on 10000 examples" in err and len(err.strip().splitlines()) == 1
    assert "recall" not in config.to_dict() or not config.recall


def test_a_config_file_takes_on_and_off_as_yaml_reads_them():
    import yaml

    from evo_attention.util.errors import UserError

    config = Config.from_dict(yaml.safe_load("compile: off\ncuda_graph: off\nbatch_models: off"))
    assert (config.compile, config.cuda_graph, config.batch_models) == ("off", "off", "off")
    assert Config.from_dict(yaml.safe_load("compile: on")).compile == "on"
    with pytest.raises(UserError, match="unknown cuda_graph 'on': valid options are auto, off"):
        Config.from_dict(yaml.safe_load("cuda_graph: on"))


def test_a_true_false_setting_refuses_anything_but_a_bool():
    from evo_attention.search import STRATEGIES
    from evo_attention.util.errors import UserError

    with pytest.raises(UserError, match="baseline must be true or false .*, got 'false'"):
        Config(baseline="false")
    for strategy, options in (("ga", {"seed_vanilla": "false"}), ("ga", {"dedupe": "no"}), ("nsga2", {"dedupe": 0})):
        config = Config(strategy=strategy, strategy_options=options)
        with pytest.raises(UserError, match=f"{next(iter(options))} must be true or false"):
            STRATEGIES[strategy].from_config(config)
    assert STRATEGIES["ga"].from_config(Config(strategy_options={"dedupe": True})).dedupe is True


def test_the_help_names_every_preset_and_shipped_suite():
    from evo_attention.cli import build_parser
    from evo_attention.data.suites import shipped_suites
    from evo_attention.train.presets import PRESETS

    search = build_parser()._subparsers._group_actions[0].choices["search"]
    helps = {option: action.help for action in search._actions for option in action.option_strings}
    assert all(name in helps["--preset"] for name in PRESETS)
    assert all(name in helps["--suite"] for name in shipped_suites())


def test_a_config_file_takes_the_words_the_flags_take_for_all():
    from evo_attention.util.errors import UserError

    config = Config.from_dict({"vocab_size": "full", "eval_steps": "All"})
    assert config.vocab_size is None and config.eval_steps is None
    with pytest.raises(UserError, match="vocab_size must be a positive integer, got 'lots'"):
        Config.from_dict({"vocab_size": "lots"})
