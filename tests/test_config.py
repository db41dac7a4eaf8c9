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
        ({"elite_size": 12}, "smaller than population_size"),
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
