"""search --keep-models: the K best trained models, saved where they trained; generate from one."""

import json
from pathlib import Path

import pytest
import torch

from evo_attention import Config
from evo_attention.cli import main
from evo_attention.search.executors import ProcessExecutor
from evo_attention.search.models import kept_model, kept_models
from evo_attention.studies.evolution import Evolution
from evo_attention.train.saving import load_model, load_tokenizer
from evo_attention.train.trainer import Trainer
from evo_attention.data import data_from_config

FLAGS = ["--preset", "quick", "--vocab-size", "16", "--seq-len", "16", "--d-model", "16", "--heads", "2",
         "--layers", "1", "--batch-size", "8", "--steps", "6", "--population", "4", "--generations", "2",
         "--elite", "1", "--quiet"]


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("keep") / "run"
    assert main(["search", *FLAGS, "--keep-models", "2", "--out", str(out)]) == 0
    return out


def _search_ranking(run_dir):
    final = json.loads((Path(run_dir) / "final_results.json").read_text())
    return [entry["gene"] if isinstance(entry["gene"], str) else entry["gene"]["key"] for entry in final["top_5"]]


def test_the_k_best_models_are_kept_and_measure_what_the_store_says(kept_run):
    kept = kept_models(kept_run)
    assert [m["rank"] for m in kept] == [1, 2] and len(list((kept_run / "models").iterdir())) == 2
    ranking = json.loads((kept_run / "final_results.json").read_text())
    assert kept[0]["gene"] == ranking["best_gene"]["key"]
    assert kept[0]["val_perplexity"] <= kept[1]["val_perplexity"]
    for entry in kept:  # the kept weights are those the record measured: evaluating them gives its loss
        model = load_model(entry["dir"])
        trainer = Trainer.from_config(entry["gene"], model.config, data_from_config(model.config))
        trainer.members[0].model = model
        assert trainer.evaluate()["val_loss"] == pytest.approx(entry["val_loss"], rel=0, abs=1e-9)
        assert load_tokenizer(entry["dir"]) is not None
    assert kept_model(kept_run, 2) == Path(kept[1]["dir"])


def test_a_rank_beyond_the_kept_models_is_one_line(kept_run, tmp_path, capsys):
    assert main(["export", "--from-run", str(kept_run), "--rank", "3", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--rank 3 is beyond the 2 models" in err and not (tmp_path / "x").exists()


def test_a_run_whose_kept_models_were_deleted_says_so(kept_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(kept_run, run, ignore=shutil.ignore_patterns("models"))  # the run keeps 2; their files are gone
    assert main(["export", "--from-run", str(run), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "keeps 2 trained model(s), but their files" in err and "--keep-models K" not in err
    assert "--overwrite" in err


def test_worker_processes_send_the_models_they_trained(tmp_path):
    settings = dict(data="recall", vocab_size=16, max_seq_len=16, d_model=16, n_heads=2, n_layers=1, dropout=0.0,
                    batch_size=8, eval_steps=None, train_steps=4, log_every=2, population_size=3, n_generations=1,
                    elite_size=1, baseline=False,
                    recall={"num_pairs": 2, "num_queries": 2, "train_examples": 64, "eval_examples": 16})
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker: the same reductions, the same weights
    try:
        with Evolution(Config(**settings), out_dir=tmp_path / "local", keep_models=3) as evo:
            evo.run()
        with Evolution(Config(**settings), out_dir=tmp_path / "process", keep_models=3,
                       executor=ProcessExecutor(2, threads=1)) as evo:
            evo.run()
    finally:
        torch.set_num_threads(before)
    local, remote = kept_models(tmp_path / "local"), kept_models(tmp_path / "process")
    assert [m["gene"] for m in local] == [m["gene"] for m in remote] and len(local) == 3
    for a, b in zip(local, remote):
        assert (Path(a["dir"]) / "model.safetensors").read_bytes() == (Path(b["dir"]) / "model.safetensors").read_bytes()


def test_generate_from_a_kept_model(kept_run, capsys):
    model = kept_models(kept_run)[0]["dir"]
    args = ["generate", "--model", model, "--prompt", "k1 v2 k3", "--max-new-tokens", "5", "--seed", "3"]
    assert main(args) == 0
    first = capsys.readouterr()
    assert first.out.startswith("k1 v2 k3") and len(first.out.split()) == 3 + 5 and "tokens/s" in first.err
    assert main(args) == 0 and capsys.readouterr().out == first.out  # same seed, same text
    assert main([*args[:3], "--prompt", "zebra", "--max-new-tokens", "1"]) == 2  # recall vocabulary: no <unk>
    assert "not in the model's vocabulary" in capsys.readouterr().err
    for bad in (["--top-k", "0"], ["--temperature", "-1"], ["--top-k", "100000"]):
        assert main([*args, *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and bad[0] in err


def test_an_unknown_prompt_reads_as_unk_said_once(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_text("the cat sat on the mat\nthe dog sat on the log\n" * 20)
    assert main(["baseline", "--data", "text", "--data-dir", str(corpus), "--seq-len", "8", "--d-model", "16",
                 "--heads", "2", "--layers", "1", "--steps", "2", "--batch-size", "4", "--save-model",
                 "--out", str(tmp_path / "b"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["generate", "--model", str(tmp_path / "b" / "model"), "--prompt", "zebra quokka",
                 "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr()
    assert out.err.count("<unk>") == 1 and "no word of the prompt" in out.err
    assert out.out.startswith("<unk> <unk>")


def test_generate_says_how_the_layers_decode(tmp_path, capsys):
    from evo_attention import TinyTransformer
    from evo_attention.data import load_data
    from evo_attention.nn.spec import ModelSpec
    from evo_attention.train.saving import save_model

    data = load_data("recall", vocab_size=16, seq_len=16, num_pairs=2, num_queries=2, train_examples=64,
                     eval_examples=16)
    spec = ModelSpec(vocab_size=data.vocab_size, d_model=16, n_heads=2, n_layers=2, max_seq_len=16)
    for genes, words in ((["dot|softmax|none|fixed"] * 2, "key/value cache,"),
                         (["dot|softmax|none|fixed", "prog=o(shift(v))"], "key/value cache + recomputed per token,")):
        save_model(TinyTransformer(spec, genes), tmp_path / "m", vocab=data.vocab)
        assert main(["generate", "--model", str(tmp_path / "m"), "--prompt", "k1 v2", "--max-new-tokens", "2"]) == 0
        assert words in capsys.readouterr().err


def _saved_tokenizer_model(tmp_path, spec):
    """A tiny untrained model saved with the tokenizer ``spec`` (char, byte, bpe:N) of a short text."""
    from evo_attention import TinyTransformer
    from evo_attention.data.tokenizers import train_tokenizer
    from evo_attention.nn.spec import ModelSpec
    from evo_attention.train.saving import save_model

    tokenizer = train_tokenizer(spec, "the cat sat on the mat\nthe dog sat on the log\n" * 20)
    model = TinyTransformer(ModelSpec(vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_layers=1,
                                      max_seq_len=16), ["dot|softmax|none|fixed"])
    return str(save_model(model, tmp_path / spec.replace(":", "-"), tokenizer=tokenizer))


def test_generate_refuses_a_seed_a_generator_cannot_take_in_one_line(tmp_path, capsys):
    model = _saved_tokenizer_model(tmp_path, "char")
    for seed in ("-5", str(2**64), "99999999999999999999999"):
        assert main(["generate", "--model", model, "--prompt", "the", "--seed", seed, "--max-new-tokens", "1"]) == 2
        assert "--seed must be an integer in 0..2^63-1" in capsys.readouterr().err


def test_a_prompt_of_spaces_is_text_where_a_space_is_a_token(tmp_path, capsys):
    for spec in ("char", "byte", "bpe:300"):
        model = _saved_tokenizer_model(tmp_path, spec)
        for prompt in (" ", "\n"):
            assert main(["generate", "--model", model, "--prompt", prompt, "--max-new-tokens", "2"]) == 0
            assert capsys.readouterr().out.startswith(prompt)
    word = _saved_tokenizer_model(tmp_path, "word")
    assert main(["generate", "--model", word, "--prompt", " ", "--max-new-tokens", "2"]) == 2
    assert "--prompt is empty" in capsys.readouterr().err


def test_a_prompt_that_is_not_utf8_is_one_line(tmp_path, capsys):
    for spec in ("word", "char", "byte", "bpe:300"):
        model = _saved_tokenizer_model(tmp_path, spec)
        for raw in (b"caf\xe9", b"\xff\xfe"):  # as Python reads such bytes from a command line
            prompt = raw.decode("utf-8", errors="surrogateescape")
            assert main(["generate", "--model", model, "--prompt", prompt, "--max-new-tokens", "1"]) == 2
            err = capsys.readouterr().err.strip()
            assert "\n" not in err and "--prompt holds bytes that are not UTF-8" in err
    assert main(["attention-maps", "--model", model, "--text", prompt, "--out", str(tmp_path / "maps")]) == 2
    assert "the --text holds bytes that are not UTF-8: give it in UTF-8" in capsys.readouterr().err


def test_a_raced_run_keeps_and_ranks_its_models_as_it_ranks_its_genes(tmp_path, monkeypatch, capsys):
    from evo_attention.report import load_run
    from evo_attention.search.racing import Racing

    race = Racing._race

    def reversed_race(self, first, generation):  # generation 0's worst one-seed gene wins; later genes lose
        raced = race(self, first, generation)
        base = self.baseline_race and self.baseline_race["gene"]
        for key, r in raced.items():
            r["told"] = 100 - r["values"][0] if generation == 0 and r["gene"] != base else 1000 + r["values"][0]
        return raced

    monkeypatch.setattr(Racing, "_race", reversed_race)
    out = tmp_path / "run"
    assert main(["search", *FLAGS, "--elite-seeds", "2", "--start-from", "vanilla", "--keep-models", "1",
                 "--out", str(out)]) == 0
    summary = load_run(out)
    assert any(r["generation"] == 1 for r in summary.racing["genes"])  # a later gene raced, and lost
    assert [m["gene"] for m in kept_models(out)] == [summary.best["key"]]
    assert json.loads((kept_model(out, 1) / "config.json").read_text())["evaluation"]["gene"] == summary.best["key"]
    kept = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("kept 1 trained model"))
    assert f"(perplexity {summary.best['perplexity']:.3f}, mean + standard error over 2 seeds, " in kept  # the table's


# a search of a few trainings of 4 steps, for counting what the driver does around them
TINY_SEARCH = dict(data="recall", vocab_size=16, max_seq_len=16, d_model=16, n_heads=2, n_layers=1, dropout=0.0,
                   batch_size=8, eval_steps=None, train_steps=4, log_every=2, n_generations=2, elite_size=1,
                   baseline=False, recall={"num_pairs": 2, "num_queries": 2, "train_examples": 64, "eval_examples": 16})


def test_keeping_models_reads_no_more_of_the_store_than_not_keeping_them(tmp_path, monkeypatch):
    from evo_attention.search.driver import Search
    from evo_attention.search.store import RunStore

    settings = {**TINY_SEARCH, "population_size": 4}
    calls = []
    for name in ("open", "evaluations"):  # RunStore.open: bound to the class, so called as it was
        monkeypatch.setattr(RunStore, name, lambda *a, _method=getattr(RunStore, name), _name=name, **k:
                            calls.append(_name) or _method(*a, **k))
    counts = {}
    for keep in (0, 2):  # a prune after each training ranks the kept models in the driver's store: no whole-run read
        calls.clear()
        with Search(Config(**settings), out_dir=tmp_path / str(keep), keep_models=keep) as search:
            search.run()
        counts[keep] = (calls.count("open"), calls.count("evaluations"))
    assert counts[2] == counts[0] and len(kept_models(tmp_path / "2")) == 2


def test_a_run_that_is_not_raced_prunes_after_each_training_only(tmp_path, monkeypatch):
    from evo_attention.search import driver
    from evo_attention.search.store import RunStore

    settings = {**TINY_SEARCH, "population_size": 3}
    pruned = []
    monkeypatch.setattr(driver, "prune_models", lambda *a, _prune=driver.prune_models: pruned.append(1) or _prune(*a))
    with driver.Search(Config(**settings), out_dir=tmp_path / "run", keep_models=1) as search:
        search.run()
    with RunStore.open(tmp_path / "run", readonly=True) as store:
        trained = len(store.evaluations("search"))
    assert len(pruned) == 1 + trained and len(kept_models(tmp_path / "run")) == 1  # the resume check, then each one
