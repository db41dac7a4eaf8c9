"""The trainer: exact evaluation, determinism, failures as records, saving, the baseline command."""

import json
import math

import pytest
import torch

from evo_attention import AttentionGene, Config, components
from evo_attention.cli import main
from evo_attention.data import data_from_config
from evo_attention.train.saving import load_model, save_model
from evo_attention.train.record import EvaluationRecord, Status
from evo_attention.train.trainer import Trainer, train_and_evaluate

RECALL = dict(data="recall", vocab_size=32, max_seq_len=32, recall={"num_pairs": 4, "train_examples": 2000,
                                                                    "eval_examples": 200},
              d_model=32, n_heads=2, n_layers=1, dropout=0.0, batch_size=16, eval_batch_size=100,
              eval_steps=None, learning_rate=2e-3, train_steps=30, log_every=10)


@pytest.fixture(scope="module")
def recall_setup():
    config = Config(**RECALL)
    return config, data_from_config(config)


def test_record_has_every_field(recall_setup):
    config, data = recall_setup
    r = train_and_evaluate("dot|sparsemax|output_gate|learned", config, data)
    assert r["status"] == "ok" and r["error"] is None
    for key in ["val_perplexity", "val_loss", "accuracy", "eval_tokens", "train_loss", "curve", "params",
                "flops_per_step", "time_s", "tokens_per_s", "peak_memory_mb", "device", "gene", "seed", "steps",
                "data_fingerprint", "versions", "precision"]:
        assert key in r, key
    assert r["gene"] == "dot|sparsemax|output_gate|learned|bias|0.10"
    assert math.isclose(r["val_perplexity"], math.exp(r["val_loss"]))
    assert r["eval_tokens"] == data.scored_tokens("valid") == 200 * 4
    assert r["eval_complete"] is True
    assert [s for s, _ in r["curve"]] == [10, 20, 30]
    assert r["flops_per_step"] > 0 and r["peak_memory_mb"] > 0 and r["params"] > 0
    json.dumps(r.to_dict())  # JSON-able (NaN/inf aside, which strict outputs write as null)
    assert isinstance(r, EvaluationRecord) and r.status is Status.OK and r.metric() == r["val_perplexity"]


def test_same_seed_same_result_and_different_seed_differs(recall_setup):
    config, data = recall_setup
    a = train_and_evaluate("cosine|entmax15|highway|adaptive", config, data, seed=3)
    b = train_and_evaluate("cosine|entmax15|highway|adaptive", config, data, seed=3)
    c = train_and_evaluate("cosine|entmax15|highway|adaptive", config, data, seed=4)
    assert a["val_loss"] == b["val_loss"] and a["curve"] == b["curve"]
    assert a["val_loss"] != c["val_loss"]


def test_training_learns_the_recall_task(recall_setup):
    config, data = recall_setup
    r = train_and_evaluate(AttentionGene.vanilla(), config.replace(train_steps=150), data)
    chance = 1 / 16  # 16 possible values with vocab 32
    assert r["val_perplexity"] < 16 and r["accuracy"] > chance


def test_continuing_a_trainer_equals_one_run(recall_setup):
    config, data = recall_setup
    one = Trainer.from_config("dot|softmax|none|fixed", config, data, seed=1)
    one.train()
    two = Trainer.from_config("dot|softmax|none|fixed", config, data, seed=1)
    two.train(until_step=12)
    two.train()
    assert one.step == two.step == config.train_steps
    assert one.evaluate()["val_loss"] == two.evaluate()["val_loss"]


def test_divergence_is_a_status_not_an_exception(recall_setup):
    config, data = recall_setup
    r = train_and_evaluate("dot|relu_norm|none|fixed", config.replace(learning_rate=1e6, grad_clip=1e9), data)
    assert r["status"] == "diverged"
    assert r["val_perplexity"] == math.inf and r["trained_steps"] <= config.train_steps


@pytest.fixture
def exploding_normalization():
    @components.register_normalization("explodes")
    def explodes(scores, mask):
        raise RuntimeError("boom in a custom component")

    @components.register_normalization("needs_memory")
    def needs_memory(scores, mask):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")

    yield
    components.unregister("normalization", "explodes")
    components.unregister("normalization", "needs_memory")


def test_errors_and_oom_become_records(recall_setup, exploding_normalization):
    config, data = recall_setup
    r = train_and_evaluate("dot|explodes|none|fixed", config, data)
    assert r["status"] == "error" and "boom in a custom component" in r["error"]
    assert r["val_perplexity"] == math.inf
    r = train_and_evaluate("dot|needs_memory|none|fixed", config, data)
    assert r["status"] == "oom"


def test_bad_device_is_a_user_error(recall_setup):
    config, data = recall_setup
    with pytest.raises(ValueError, match="device"):
        train_and_evaluate("dot|softmax|none|fixed", config.replace(device="tpu"), data)


def test_cosine_schedule():
    from evo_attention.train.schedules import scheduled_rate

    recipe = Config(learning_rate=1.0, warmup_steps=10, lr_schedule="cosine").train
    assert scheduled_rate(recipe, 0, 110) == pytest.approx(0.1)
    assert scheduled_rate(recipe, 9, 110) == pytest.approx(1.0)
    assert scheduled_rate(recipe, 60, 110) == pytest.approx(0.5)
    assert scheduled_rate(recipe, 110, 110) == pytest.approx(0.0, abs=1e-12)


def test_save_and_load_model_round_trip(recall_setup, tmp_path):
    config, data = recall_setup
    trainer = Trainer.from_config("additive|entmax15|output_gate|adaptive", config, data)
    trainer.train(until_step=5)
    save_model(trainer.model, tmp_path / "m", vocab=data.vocab)
    model = load_model(tmp_path / "m")
    trainer.model.eval()
    x, _ = next(data.eval_batches("valid", 4))
    assert torch.equal(model(x), trainer.model(x))
    with pytest.raises(ValueError, match="no model directory"):
        load_model(tmp_path / "missing")


@pytest.mark.slow
def test_wikitext_full_split_evaluation_scores_every_token_once(wikitext_dir):
    config = Config(data="wikitext2", data_dir=str(wikitext_dir), vocab_size=2000, d_model=16, n_heads=2,
                    n_layers=1, max_seq_len=64, batch_size=8, eval_batch_size=256, eval_steps=None,
                    train_steps=30, learning_rate=3e-3, log_every=10)
    data = data_from_config(config)
    r = train_and_evaluate(AttentionGene.vanilla(), config, data)
    assert r["status"] == "ok"
    assert r["eval_tokens"] == 217_645  # every token of valid.txt (217,646 with <eos>) but the first
    assert r["val_perplexity"] < 2000  # well below chance (uniform over the vocabulary)
    capped = train_and_evaluate(AttentionGene.vanilla(), config.replace(eval_steps=2), data)
    assert capped["eval_tokens"] == 2 * 256 * 64 and capped["eval_complete"] is False


def test_seed_data_api_trains_through_loaders(wikitext_dir):
    from evo_attention.data import LoaderData
    from evo_attention.utils import get_dataloaders, set_seed

    set_seed(0)
    train_loader, eval_loader = get_dataloaders(500, 32, 8, 64, use_wikitext=True, data_dir=str(wikitext_dir))
    data = LoaderData(train_loader, eval_loader, vocab_size=500, seq_len=32)
    config = Config(vocab_size=500, d_model=16, n_heads=2, n_layers=1, max_seq_len=32, train_steps=5, eval_steps=3)
    r = train_and_evaluate(AttentionGene.vanilla(), config, data)
    assert r["status"] == "ok" and r["eval_tokens"] == 3 * 64 * 32


# --- the baseline command -----------------------------------------------------------------

def _quick_flags(tmp_path):
    return ["--preset", "quick", "--steps", "20", "--out", str(tmp_path / "b"), "--quiet",
            "--d-model", "32", "--layers", "1"]


def test_baseline_command_writes_result(tmp_path):
    assert main(["baseline", *_quick_flags(tmp_path), "--save-model"]) == 0
    result = json.loads((tmp_path / "b" / "result.json").read_text())
    for key in ["val_perplexity", "val_loss", "accuracy", "eval_tokens", "params", "train_loss", "time_s"]:
        assert key in result
    assert result["gene"] == AttentionGene.vanilla().key and result["steps"] == 20
    assert load_model(tmp_path / "b" / "model").gene == AttentionGene.vanilla()


def test_baseline_test_split_and_gene(tmp_path):
    assert main(["baseline", *_quick_flags(tmp_path), "--gene", "dot|sparsemax|output_gate|learned",
                 "--eval-split", "test"]) == 0
    result = json.loads((tmp_path / "b" / "result.json").read_text())
    assert result["eval_split"] == "test" and result["gene"].startswith("dot|sparsemax|output_gate|learned")


@pytest.mark.parametrize("flags, words", [
    (["--data", "wikitext2", "--data-dir", "/nonexistent/wt2"], "/nonexistent/wt2"),
    (["--gene", "dot|sparsemaxx|none|fixed"], "sparsemaxx"),
    (["--d-model", "30", "--heads", "4"], "not divisible"),
    (["--vocab-size", "1"], "--vocab-size must be at least 2"),
    (["--preset", "huge"], "huge"),
    (["--config", "/nonexistent/cfg.yaml"], "/nonexistent/cfg.yaml"),
    (["--device", "cuda:7"], "cuda"),
])
def test_baseline_bad_input_is_one_line_and_exit_2(tmp_path, capsys, flags, words):
    assert main(["baseline", "--quiet", "--steps", "1", "--out", str(tmp_path / "x"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evo-attention: error:") and words in err and "\n" not in err
    assert "Traceback" not in err


def test_config_file_unknown_key_is_named(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("d_model: 32\nlearning_rat: 0.1\n")
    assert main(["baseline", "--config", str(cfg), "--out", str(tmp_path / "x")]) == 2
    assert "learning_rat" in capsys.readouterr().err
    cfg.write_text("d_model: [32\n")
    assert main(["baseline", "--config", str(cfg), "--out", str(tmp_path / "x")]) == 2
    assert "not valid YAML" in capsys.readouterr().err
