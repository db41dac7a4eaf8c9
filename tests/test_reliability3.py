"""Reliability 3 (docs/reliability.md): no command writes over a store or a model, everything that
decides a result is pinned by the run, every study store has one writer."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from conftest import STUDY_FLAGS
from evo_attention import Config, Evolution
from evo_attention.cli import main
from evo_attention.search.store import RunStore
from evo_attention.util.errors import UserError

TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 128, "eval_examples": 32},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=32, eval_steps=None,
            learning_rate=3e-3, train_steps=4, log_every=2, population_size=2, n_generations=1, elite_size=1)
FLAGS = ["--preset", "quick", "--vocab-size", "16", "--seq-len", "16", "--d-model", "16", "--heads", "2",
         "--layers", "1", "--batch-size", "8", "--steps", "4", "--population", "2", "--generations", "1",
         "--elite", "1", "--quiet"]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("evo-attention: error:") and "\n" not in err and "Traceback" not in err, err
    return err


def digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    assert main(["search", *FLAGS, "--out", str(out), "--keep-models", "1"]) == 0
    return out


def test_the_protected_names_are_those_of_their_homes():
    from evo_attention.interop.pretrained import WEIGHTS
    from evo_attention.search.lock import LOCK_NAME
    from evo_attention.search.store import DB_NAME
    from evo_attention.util.files import PROTECTED

    assert {DB_NAME, LOCK_NAME, WEIGHTS} == set(PROTECTED)


# -- item 1: report --optuna-journal writes only over a journal -------------------------------------
def test_1_the_journal_never_replaces_a_store_or_any_other_file(finished_run, tmp_path, capsys):
    pytest.importorskip("optuna")
    store = finished_run / "run.db"
    before = digest(store)
    other = tmp_path / "notes.txt"
    other.write_text("mine\n")
    for target, fragment in ((store, "holds a run store"), (finished_run / "run.lock", "run directory"),
                             (other, "is not an Optuna journal")):
        assert main(["report", str(finished_run), "--optuna-journal", str(target)]) == 2
        err = one_line_error(capsys)
        assert fragment in err and str(target) in err and "--optuna-journal" in err
    assert digest(store) == before and other.read_text() == "mine\n"
    RunStore.open(finished_run, readonly=True).check_integrity()
    journal = tmp_path / "study.log"
    assert main(["report", str(finished_run), "--optuna-journal", str(journal)]) == 0
    assert main(["report", str(finished_run), "--optuna-journal", str(journal)]) == 0  # its own kind: replaced
    capsys.readouterr()
    assert main(["report", str(finished_run), "--optuna-journal", ""]) == 2
    assert "--optuna-journal is empty" in one_line_error(capsys)


def test_1_a_live_runs_store_is_refused_and_the_search_ends_well(tmp_path, capsys):
    pytest.importorskip("optuna")
    out = tmp_path / "live"
    with Evolution(Config(**TINY), out_dir=out) as evo:
        assert main(["report", str(out), "--optuna-journal", str(out / "run.db")]) == 2
        one_line_error(capsys)
        evo.run()
    assert len(RunStore.open(out, readonly=True).evaluations()) >= 2


def test_14_a_journal_under_a_file_is_one_line(finished_run, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(["report", str(finished_run), "--optuna-journal", str(tmp_path / "afile" / "j.log")]) == 2
    assert "is a file, not a directory" in one_line_error(capsys)


# -- item 2: export --out never replaces its source, a store or a model ----------------------------
def test_2_export_refuses_its_source_a_run_and_any_model_directory(finished_run, tmp_path, capsys):
    from evo_attention.search.models import kept_model

    model = Path(kept_model(finished_run, 1))
    before = {p.name: digest(p) for p in model.iterdir()}
    for fmt in ("standalone", "hf"):
        for source in (["--model", str(model)], ["--from-run", str(finished_run)]):
            for out in (model, finished_run):
                assert main(["export", *source, "--format", fmt, "--out", str(out)]) == 2
                err = one_line_error(capsys)
                assert str(out) in err and "--out" in err and "would destroy it" in err
    assert {p.name: digest(p) for p in model.iterdir()} == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"someone's weights")
    assert main(["export", "--model", str(model), "--out", str(other)]) == 2
    assert "holds a saved model" in one_line_error(capsys)
    assert (other / "model.safetensors").read_bytes() == b"someone's weights"
    assert main(["export", "--model", str(model), "--out", str(tmp_path / "e")]) == 0
    assert main(["export", "--model", str(model), "--out", str(tmp_path / "e")]) == 0  # its own kind: written again
    capsys.readouterr()
    assert main(["export", "--model", str(model), "--out", ""]) == 2
    assert "--out is empty" in one_line_error(capsys)


# -- item 3: --keep-models is part of the run ------------------------------------------------------
KEEP_FLAGS = [*FLAGS[:-5], "--population", "4", "--generations", "2", "--quiet"]


def test_3_a_resumed_run_keeps_what_the_uninterrupted_one_keeps(tmp_path, capsys, monkeypatch):
    from evo_attention.search.driver import Search
    from evo_attention.search.models import kept_models

    whole = tmp_path / "whole"
    assert main(["search", *KEEP_FLAGS, "--keep-models", "2", "--out", str(whole)]) == 0
    cut = tmp_path / "cut"
    calls = []
    original = Search._after_generation

    def stop_after_the_first(self):
        original(self)
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(Search, "_after_generation", stop_after_the_first)
        assert main(["search", *KEEP_FLAGS, "--keep-models", "2", "--out", str(cut)]) != 0
    capsys.readouterr()
    assert main(["search", *KEEP_FLAGS, "--resume", "--keep-models", "3", "--out", str(cut)]) == 2
    assert "--keep-models 3 differs from the 2" in one_line_error(capsys)
    assert main(["search", *KEEP_FLAGS, "--resume", "--out", str(cut)]) == 0
    assert [m["gene"] for m in kept_models(cut)] == [m["gene"] for m in kept_models(whole)]


# -- items 5, 6, 12: every study store has one writer and its own kind; one rule for --out ---------
CURVE_DATA = "mqar:seq_len=16,vocab=16,train_examples=64,eval_examples=16,pairs=2"


def _no_training(monkeypatch):
    import evo_attention.search.executors.base as base

    def fail(*a, **k):
        pytest.fail("trained again")

    monkeypatch.setattr(base, "execute", fail)
    monkeypatch.setattr(base, "execute_batch", fail)


def test_5_a_compare_store_has_one_writer_and_its_own_kind(tmp_path, capsys, monkeypatch):
    from evo_attention.search.lock import RunLock

    out = tmp_path / "cmp"
    with RunLock(out):  # a compare running elsewhere holds its store
        _no_training_ctx = monkeypatch.context()
        with _no_training_ctx:
            _no_training(monkeypatch)
            assert main(["compare", "--configs", "baseline", "--seeds", "1", "--out", str(out), *STUDY_FLAGS]) == 2
            assert "is in use by process" in one_line_error(capsys)
    monkeypatch.undo()
    assert main(["compare", "--configs", "baseline", "--seeds", "1", "--out", str(out), *STUDY_FLAGS]) == 0
    assert RunStore.open(out, readonly=True).kind() == "compare"
    capsys.readouterr()
    assert main(["search", *FLAGS, "--resume", "--out", str(out)]) == 2
    assert "holds the store of a compare, not of a search" in one_line_error(capsys)
    assert main(["curve", "--genes", "baseline", "--knob", "queries=1,2", "--seeds", "1", "--out", str(out),
                 *STUDY_FLAGS, "--data", CURVE_DATA]) == 2
    assert "holds a run store" in one_line_error(capsys)
    with monkeypatch.context() as patch:  # its own kind: continued, nothing trained again
        _no_training(patch)
        assert main(["compare", "--configs", "baseline", "--seeds", "1", "--out", str(out), *STUDY_FLAGS]) == 0


def test_6_a_validation_without_a_run_keeps_its_trainings_in_out(tmp_path, capsys, monkeypatch):
    out = tmp_path / "val"
    command = ["validate", "--genes", "dot|softmax|none|fixed|nobias|0.00|pos=rope", "--seeds", "2", "--out", str(out),
               *STUDY_FLAGS]
    assert main(command) == 0
    assert RunStore.open(out, readonly=True).kind() == "validate"
    _no_training(monkeypatch)
    assert main(command) == 0  # an interrupted or repeated validation trains no finished seed again


@pytest.mark.parametrize("command", [
    ["compare", "--configs", "baseline", "--seeds", "1", *STUDY_FLAGS],
    ["curve", "--genes", "baseline", "--knob", "queries=1,2", "--seeds", "1", *STUDY_FLAGS, "--data", CURVE_DATA],
    ["validate", "--genes", "dot|sparsemax|none|fixed", "--seeds", "2", *STUDY_FLAGS],
    ["ablate", "--gene", "dot|softmax|output_gate|fixed|nobias|0.00", "--seeds", "2", *STUDY_FLAGS],
    ["attention-maps", "--gene", "dot|softmax|none|fixed", *STUDY_FLAGS],
    ["baseline", *STUDY_FLAGS],
])
def test_12_an_empty_out_is_refused_everywhere(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _no_training(monkeypatch)
    assert main([*command, "--out", ""]) == 2
    assert "--out is empty" in one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []


# -- item 4: the probe answers that decide a result are pinned by the run ----------------------------
@pytest.fixture
def probing(tmp_path, monkeypatch):
    """A CPU with native bf16 where bf16 measures faster, a fresh probe cache and pin table."""
    from evo_attention.train import environment, probe_cache
    from evo_attention.train import trainer as engine

    monkeypatch.setenv("EVO_ATTENTION_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(environment.ENV_PRECISION_PROBE, "on")
    monkeypatch.setattr(environment, "_PRECISION_CHOICES", {})
    monkeypatch.setattr(environment, "cpu_has_fast_bf16", lambda: True)
    for name in ("_PINNED", "_USED"):
        monkeypatch.setattr(probe_cache, name, {})
    monkeypatch.setattr(probe_cache, "_WARNED", set())
    monkeypatch.setattr(engine, "precision_step_times", lambda *a, **k: {"fp32": 0.030, "bf16": 0.010})
    return tmp_path / "cache"


def test_4_a_resume_after_a_changed_probe_file_keeps_the_runs_precision(probing, tmp_path, monkeypatch, recwarn):
    from evo_attention.search.driver import Search
    from evo_attention.search.runner import PROBES
    from evo_attention.train import environment

    out = tmp_path / "run"
    calls = []
    original = Search._after_generation

    def stop_after_the_first(self):
        original(self)
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(Search, "_after_generation", stop_after_the_first)
        assert main(["search", *KEEP_FLAGS, "--batch-models", "off", "--out", str(out)]) != 0
    [probe] = probing.glob("precision-*.json")
    assert RunStore.open(out, readonly=True).get_meta(PROBES)[probe.name]["precision"] == "bf16"
    probe.write_text(json.dumps({"precision": "fp32", "fp32_ms": 1.0, "bf16_ms": 9.0}))  # another answer now
    environment._PRECISION_CHOICES.clear()  # a new process
    assert main(["search", *KEEP_FLAGS, "--batch-models", "off", "--resume", "--out", str(out)]) == 0
    records = RunStore.open(out, readonly=True).evaluations()
    assert len(records) > 4 and {r["precision"] for r in records} == {"bf16"}
    said = [str(w.message) for w in recwarn if "differs from the one this run pinned" in str(w.message)]
    assert len(said) == 1 and probe.name in said[0]


def test_4_a_probe_file_with_other_timings_but_the_same_answer_is_not_reported(probing, recwarn):
    import torch

    from evo_attention.nn.model import ModelSpec
    from evo_attention.train import environment, probe_cache

    spec = ModelSpec(vocab_size=16, d_model=16, n_heads=2, n_layers=1, max_seq_len=8)
    cpu = torch.device("cpu")

    def probe():
        environment._PRECISION_CHOICES.clear()  # as in a new process of the same run
        return environment.probed_precision(spec, 8, 4, cpu, timer=lambda: {"fp32": 0.030, "bf16": 0.010})[0]

    assert probe() == "bf16"
    [path] = probing.glob("precision-*.json")
    probe_cache.pin_probes(probe_cache.used_probes())  # the run pins what it used
    # re-measured since (other timings, the same precision): nothing to report
    path.write_text(json.dumps({**json.loads(path.read_text()), "fp32_ms": 31.0, "bf16_ms": 12.0}))
    assert probe() == "bf16"
    assert not [w for w in recwarn if "differs from the one this run pinned" in str(w.message)]
    # another precision: reported once, and the pinned answer still decides
    path.write_text(json.dumps({**json.loads(path.read_text()), "precision": "fp32"}))
    assert probe() == "bf16" and probe() == "bf16"
    said = [str(w.message) for w in recwarn if "differs from the one this run pinned" in str(w.message)]
    assert len(said) == 1 and path.name in said[0]


def test_4_an_unwritable_probe_cache_is_said_once(probing, tmp_path, monkeypatch):
    import torch

    from evo_attention.train import environment

    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("EVO_ATTENTION_CACHE_DIR", str(tmp_path / "afile" / "cache"))
    cpu = torch.device("cpu")
    with pytest.warns(UserWarning, match="cannot keep probe answers") as said:
        for d_model in (16, 32):
            spec = Config(d_model=d_model, vocab_size=16).model
            assert environment.choose_precision("auto", cpu, spec, seq_len=16, batch_size=4,
                                                timer=lambda: {"fp32": 0.03, "bf16": 0.01})[0] == "bf16"
    assert len([w for w in said if "cannot keep probe answers" in str(w.message)]) == 1


# -- items 8 and 14 ------------------------------------------------------------------------------------
def test_8_fp16_is_refused_before_the_run_is_created(tmp_path, capsys):
    """fp16 on any device (no loss scaling: its small gradients would vanish); shown on the CPU."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        main(["search", *FLAGS, "--device", "cpu", "--precision", "fp16", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "\n" not in err and "invalid choice: 'fp16'" in err, err
    config = tmp_path / "fp16.yaml"
    config.write_text("precision: fp16\n")
    assert main(["search", *FLAGS, "--config", str(config), "--out", str(out)]) == 2
    assert "unknown precision 'fp16'" in one_line_error(capsys)
    assert not out.exists()
    assert main(["search", *FLAGS, "--device", "cpu", "--out", str(out)]) == 0  # the place is free for a run


def test_14_sigterm_to_a_study_says_what_it_kept_and_how_to_go_on(tmp_path, capsys, monkeypatch):
    import os
    import signal
    import time

    import evo_attention.search.executors.base as base

    def terminated(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        pytest.fail("SIGTERM did not stop the study")

    monkeypatch.setattr(base, "execute", terminated)
    monkeypatch.setattr(base, "execute_batch", terminated)
    before = signal.getsignal(signal.SIGTERM)
    try:
        out = tmp_path / "cmp"
        assert main(["compare", "--configs", "baseline", "--seeds", "1", "--out", str(out), *STUDY_FLAGS]) == 130
    finally:
        signal.signal(signal.SIGTERM, before)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("evo-attention: interrupted;") and str(out / "run.db") in err and "again" in err


# -- item 7: every generated dataset and every model is estimated against the memory before it is built --
GB = 2**30
GEN_FLAGS = [f for i, f in enumerate(FLAGS) if f not in ("--vocab-size", "--seq-len") and FLAGS[i - 1] not in
             ("--vocab-size", "--seq-len")]


@pytest.fixture
def small_machine(monkeypatch):
    """A machine with 2 GB available where building a vocabulary or generating a split fails the test."""
    import evo_attention.data.recall as recall
    import evo_attention.data.synthetic as synthetic
    import evo_attention.util.memory as memory

    monkeypatch.setattr(memory, "available_memory", lambda: 2 * GB)

    def built(*a, **k):
        pytest.fail("built before the memory was checked")

    monkeypatch.setattr(recall, "Vocab", built)
    monkeypatch.setattr(synthetic, "Vocab", built)
    monkeypatch.setattr(recall, "generate", built)
    for task in synthetic.TASKS.values():
        monkeypatch.setattr(type(task), "generate", built)


@pytest.mark.parametrize("data, fragments", [
    (["--data", "mqar", "--seq-len", "2000000"], ["2,000,001 tokens", "--seq-len"]),
    (["--data", "mqar:train_examples=100000000000"], ["100,000,002,000 examples", "train_examples"]),
    (["--data", "mqar:vocab=99999999"], ["99,999,999 symbols", "mqar:vocab=N"]),
    (["--data", "mad:selective_copy:seq_len=2000000"], ["2,000,001 tokens", "mad:selective_copy:seq_len=N"]),
    (["--data", "recall", "--vocab-size", "99999999"], ["99,999,999 symbols", "lower --vocab-size"]),
    (["--data", "recall", "--seq-len", "2000000"], ["2,000,001 tokens", "lower --seq-len"]),
])
def test_7_a_generated_task_beyond_memory_is_one_line_before_it_is_built(data, fragments, small_machine, tmp_path,
                                                                         capsys):
    out = tmp_path / "run"
    assert main(["search", *GEN_FLAGS, *data, "--out", str(out)]) == 2
    err = one_line_error(capsys)
    assert "needs about" in err and "this machine has 2.0 GB available" in err, err
    assert all(f in err for f in fragments), err
    assert not out.exists()


def test_7_a_model_beyond_memory_is_one_line_before_it_is_built(tmp_path, capsys, monkeypatch):
    import evo_attention.train.trainer as engine
    import evo_attention.util.memory as memory

    monkeypatch.setattr(memory, "available_memory", lambda: GB // 2)

    def built(*a, **k):
        pytest.fail("a model was built before the memory was checked")

    monkeypatch.setattr(engine, "Member", built)
    assert main(["baseline", *STUDY_FLAGS, "--vocab-size", "100000", "--d-model", "512", "--heads", "8",
                 "--out", str(tmp_path / "b")]) == 2
    err = one_line_error(capsys)
    assert "training a model of" in err and "0.5 GB available" in err and "--vocab-size" in err, err


# -- item 15: the tool recognises its HF format; an HF export carries checksums checked on load ----------
@pytest.fixture(scope="module")
def hf_export(tmp_path_factory):
    """One export for the module's tests (a test that changes it works on its own copy)."""
    from evo_attention.data.tokenizers import train_tokenizer
    from evo_attention.nn.model import TinyTransformer
    from evo_attention.nn.spec import ModelSpec
    from evo_attention.train.saving import save_model

    tokenizer = train_tokenizer("word", "the cat sat on the mat .\na dog ran to the cat .\n" * 8, 16)
    model = TinyTransformer(ModelSpec(vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_layers=1,
                                      max_seq_len=8, dropout=0.0), ["dot|softmax|none|fixed|nobias|0.00|pos=rope"])
    tmp_path = tmp_path_factory.mktemp("hf-export")
    save_model(model, tmp_path / "model", tokenizer=tokenizer)
    assert main(["export", "--model", str(tmp_path / "model"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    return tmp_path / "hf"


def test_15_commands_that_load_a_model_name_the_hf_format(hf_export, tmp_path, capsys):
    capsys.readouterr()
    for command in (["generate", "--model", str(hf_export), "--prompt", "the"],
                    ["attention-maps", "--model", str(hf_export), "--out", str(tmp_path / "maps")],
                    ["export", "--model", str(hf_export), "--out", str(tmp_path / "e")]):
        assert main(command) == 2
        err = one_line_error(capsys)
        assert "is a transformers export (export --format hf)" in err and "from_pretrained" in err, err
        assert "damaged" not in err


def test_15_a_flipped_bit_in_an_hf_export_is_refused_on_load(hf_export, tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    hf_export = Path(shutil.copytree(hf_export, tmp_path / "hf"))  # this test damages its copy
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    listed = json.loads((hf_export / "config.json").read_text())["evo_attention"]["files"]
    assert listed["model.safetensors"] == digest(hf_export / "model.safetensors") and "tokenizer.json" in listed
    model = AutoModelForCausalLM.from_pretrained(hf_export, trust_remote_code=True)  # intact: loads
    model.save_pretrained(tmp_path / "again")  # transformers' own files: no stale checksums
    AutoModelForCausalLM.from_pretrained(tmp_path / "again", trust_remote_code=True)
    weights = bytearray((hf_export / "model.safetensors").read_bytes())
    weights[-10] ^= 0x40
    (hf_export / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(OSError, match="model.safetensors was altered or damaged"):
        AutoModelForCausalLM.from_pretrained(hf_export, trust_remote_code=True)


# -- item 16: report A B compares searches of one kind; attention-maps checks its input first; status ------
SUITE_YAML = {"suite": "tiny", "steps": 2, "defaults": {"vocab": 12, "train_examples": 64, "eval_examples": 16},
              "points": [{"label": "recall", "task": "mad:in_context_recall", "knobs": {"seq_len": 12, "pairs": 2}},
                         {"label": "copy", "task": "mad:selective_copy", "knobs": {"seq_len": 12, "copy": 2}}]}


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    import yaml

    root = tmp_path_factory.mktemp("suite")
    (root / "tiny.yaml").write_text(yaml.safe_dump(SUITE_YAML))
    assert main(["search", *GEN_FLAGS[:-5], "--population", "4", "--generations", "1", "--quiet", "--suite",
                 str(root / "tiny.yaml"), "--out", str(root / "run")]) == 0
    return root / "run"


def test_16_report_of_several_runs_refuses_to_mix_kinds(finished_run, suite_run, tmp_path, capsys):
    study = tmp_path / "cmp"
    assert main(["compare", "--configs", "baseline", "--seeds", "1", "--out", str(study), *STUDY_FLAGS]) == 0
    suite = suite_run
    capsys.readouterr()
    out = tmp_path / "both"
    assert main(["report", str(finished_run), str(study), "--out", str(out)]) == 2
    err = one_line_error(capsys)
    assert f"{study} holds the store of a compare, not of a search" in err
    assert main(["report", str(suite), str(finished_run), "--out", str(out)]) == 2
    assert f"{suite} is a suite run (ranked by suite accuracy) and {finished_run} is not" in one_line_error(capsys)
    assert not (out / "runs.json").exists()


@pytest.mark.parametrize("flags, fragment", [
    (["--length", "0"], "--length 0 is too short"),
    (["--sample", "99999999"], "--sample 99999999 is out of range"),
    (["--text", "k0 v0 nonsense"], "nonsense"),
])
def test_16_attention_maps_checks_its_input_before_training(flags, fragment, tmp_path, capsys, monkeypatch):
    import evo_attention.train.trainer as engine

    def trained(*a, **k):
        pytest.fail("trained before the input was checked")

    monkeypatch.setattr(engine, "run_training", trained)
    assert main(["attention-maps", "--gene", "dot|softmax|none|fixed", *STUDY_FLAGS, *flags,
                 "--out", str(tmp_path / "maps")]) == 2
    assert fragment in one_line_error(capsys)


def test_16_status_counts_study_trainings_apart_from_the_search_plan(tmp_path, capsys):
    from evo_attention.report.status import run_status

    out = tmp_path / "run"
    assert main(["search", *FLAGS, "--out", str(out)]) == 0
    before = run_status(out)
    assert main(["validate", "--from-run", str(out), "--top", "1", "--seeds", "2", "--quiet"]) == 0
    after = run_status(out)
    assert after["trained"] == before["trained"] and after["cache_hits"] == before["cache_hits"]
    assert sum(after["study_trainings"].values()) > 0
    capsys.readouterr()
    assert main(["status", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"{before['trained']} trainings recorded" in text and "validate training" in text, text


# -- item 10: a suite run is read as one: its ranking, its data ------------------------------------------
def test_10_init_from_a_suite_run_ranks_by_suite_accuracy(suite_run):
    from evo_attention.report import load_run
    from evo_attention.search.warm_start import ranked_genes

    with RunStore.open(suite_run, readonly=True) as store:
        ranked = ranked_genes(store, ["perplexity"])
    by_suite = [r["gene"] for r in load_run(suite_run).suite["genes"] if r["rank"] is not None]
    assert ranked == by_suite and len(ranked) == 4


def test_10_compare_and_maps_from_a_suite_run_use_its_suite(suite_run, tmp_path, capsys, monkeypatch):
    import evo_attention.data as data

    def no_corpus(*a, **k):
        pytest.fail("a corpus was loaded for a suite run")

    monkeypatch.setattr(data, "load_corpus", no_corpus)
    flags = STUDY_FLAGS[2:]  # no --data: the run's
    out = tmp_path / "cmp"
    assert main(["compare", "--from-run", str(suite_run), "--configs", "baseline", *flags, "--out", str(out)]) == 0
    assert (out / "compare_suite.json").exists()
    assert main(["attention-maps", "--from-run", str(suite_run), *flags, "--out", str(tmp_path / "maps")]) == 2
    err = one_line_error(capsys)
    assert "is a suite run" in err and "give --data" in err and "mad:selective_copy:" in err
    point = "mad:selective_copy:copy=2,eval_examples=16,seq_len=12,train_examples=64,vocab=12"
    assert main(["attention-maps", "--from-run", str(suite_run), *flags, "--data", point,
                 "--out", str(tmp_path / "maps")]) == 0


# -- item 11: a plugin's component is named by the genes of every command ------------------------------
PLUGIN = """
import torch
from evo_attention import register_normalization, row_normalize
from evo_attention.nn import components

@register_normalization("r3_cubed")
def cubed(scores, mask):
    return row_normalize(torch.relu(scores.float()) ** 3, mask).to(scores.dtype)

@components.register_similarity("r3_unfolded")
class Unfolded(components.Similarity):
    def __init__(self, d_head, n_heads):
        super().__init__(d_head, n_heads)
        self.scale = torch.nn.Parameter(torch.ones(n_heads, 1, 1))

    def forward(self, q, k):
        return self.scale * (q @ k.transpose(-2, -1))
"""


@pytest.fixture
def r3_plugin(tmp_path, monkeypatch):
    import sys

    from evo_attention.nn import components

    (tmp_path / "r3_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "r3_plugin"
    components.unregister("normalization", "r3_cubed")
    components.unregister("similarity", "r3_unfolded")
    sys.modules.pop("r3_plugin", None)


@pytest.mark.parametrize("command", [["validate", "--genes", "dot|r3_cubed|none|fixed", "--seeds", "2"],
                                     ["ablate", "--gene", "dot|r3_cubed|none|fixed", "--seeds", "2"]])
def test_11_a_study_takes_a_plugin_component_by_name(command, r3_plugin, tmp_path, capsys):
    assert main([*command, "--plugin", r3_plugin, *STUDY_FLAGS, "--out", str(tmp_path / "out")]) == 0


def test_11_bench_of_an_unfoldable_plugin_gene_is_one_line(r3_plugin, capsys):
    assert main(["bench", "--plugin", r3_plugin, "--gene", "r3_unfolded|softmax|none|fixed", "--models", "4",
                 *STUDY_FLAGS[:-1]]) == 2
    err = one_line_error(capsys)
    assert "cannot be folded into a batch" in err and "--models 1" in err


# -- item 13: a setting the command does not use is said; one that contradicts is refused ------------------
@pytest.mark.parametrize("command, said", [
    (["validate", "--genes", "dot|sparsemax|none|fixed", "--seeds", "2", "--tuning-seeds", "2"],
     "--tuning-seeds is used only with --lr-grid"),
    (["validate", "--genes", "dot|sparsemax|none|fixed", "--seeds", "2", "--mde", "0.05", "--max-seeds", "9"],
     "--mde is used only with --seeds auto"),
    (["compare", "--configs", "baseline", "--lr-grid", "1e-3,2e-3", "--tuning-seeds", "1", "--lr", "0.01"],
     "--lr is not used with --lr-grid"),
    (["baseline", "--lr-schedule", "cosine", "--warmup-steps", "0", "--decay-fraction", "0.3"],
     "--decay-fraction is not used by --lr-schedule cosine"),
    (["baseline", "--executor", "local", "--workers", "2"], "--workers is used only with --lr-grid"),
])
def test_13_an_unused_setting_is_one_warning_and_the_command_goes_on(command, said, tmp_path, recwarn):
    assert main([*command, *STUDY_FLAGS, "--out", str(tmp_path / "out")]) == 0
    notes = [str(w.message) for w in recwarn if said in str(w.message)]
    assert len(notes) == 1 and notes[0].endswith("ignored"), notes


def test_13_a_config_files_search_settings_that_the_command_does_not_use_are_one_warning_each(tmp_path, recwarn):
    config = tmp_path / "ign.yaml"
    config.write_text("max_params: 10\nstrategy: random\nn_generations: 7\n"
                      "search_space: {normalization: [sparsemax]}\n")
    assert main(["baseline", "--config", str(config), *STUDY_FLAGS, "--out", str(tmp_path / "out")]) == 0
    notes = [str(w.message) for w in recwarn if "search setting" in str(w.message)]
    assert notes == [f"{key} (config file {config}) is a search setting that baseline does not use: ignored"
                     for key in ("max_params", "strategy", "n_generations", "search_space")]


@pytest.mark.parametrize("command, unused", [
    ("validate", ["fidelity", "objectives"]),  # it has --suite and --baseline-gene of its own
    ("transfer", ["fidelity", "objectives"]),  # its verdicts are against baseline_gene; it refuses a suite
    ("curve", ["fidelity", "objectives", "suite"]),  # baseline_gene: the attention dropout of its named genes
    ("search", []),
])
def test_13_which_search_settings_of_a_config_file_a_command_does_not_use(command, unused, tmp_path, recwarn):
    from evo_attention.cli import build_parser
    from evo_attention.cli.common import note_unused_keys

    config = tmp_path / "c.yaml"
    config.write_text("fidelity: halving\nobjectives: [perplexity, params]\nbaseline_gene: dot|softmax|none|fixed\n"
                      "suite: mad-cpu\nlearning_rate: 0.002\n")
    note_unused_keys(build_parser().parse_args([command, "--config", str(config)]))
    assert [str(w.message).split(" ")[0] for w in recwarn] == unused


def test_13_bench_says_the_search_settings_it_does_not_use(recwarn):
    assert main(["bench", "--init-from", "runs/x", "--max-params", "100", "--budget", "2", *STUDY_FLAGS[:-1]]) == 0
    said = " ".join(str(w.message) for w in recwarn)
    assert "--init-from is a search setting that bench does not use" in said
    assert "--max-params is a search setting that bench does not use" in said


def test_13_a_contradicting_setting_is_refused(suite_run, tmp_path, capsys):
    suite_file = suite_run.parent / "tiny.yaml"
    cases = [
        (["baseline", *STUDY_FLAGS, "--lr-schedule", "constant", "--warmup-steps", "5"],
         "--warmup-steps does not apply to --lr-schedule constant"),
        (["baseline", *STUDY_FLAGS, "--gene", "dot|softmax|none|fixed|lr="], "gene part lr= in"),
        (["search", *GEN_FLAGS, "--suite", str(suite_file), "--objectives", "perplexity"],
         "--objectives perplexity does not apply with --suite"),
    ]
    both = tmp_path / "both.yaml"
    both.write_text(f"suite: {suite_file}\ndata: recall\n")
    cases.append((["search", *GEN_FLAGS, "--config", str(both)], "data and suite both name the data (config file"))
    for command, refused in cases:
        out = tmp_path / "out"
        assert main([*command, "--out", str(out)]) == 2
        assert refused in one_line_error(capsys)
        assert not (out / "run.db").exists()


# -- item 12: messages in the user's words, one warning format, duplicate keys in a suite refused ----------
def test_12_a_suite_file_with_a_key_twice_or_no_name_is_one_line_in_its_own_words(tmp_path, capsys):
    twice = tmp_path / "twice.yaml"
    twice.write_text("suite: t\nsteps: 2\nsteps: 3\npoints:\n  - {label: a, task: mqar, knobs: {seq_len: 12}}\n")
    assert main(["search", *GEN_FLAGS, "--suite", str(twice), "--out", str(tmp_path / "a")]) == 2
    assert "sets steps twice (lines 2 and 3)" in one_line_error(capsys)
    nameless = tmp_path / "nameless.yaml"
    nameless.write_text("points: []\n")
    assert main(["search", *GEN_FLAGS, "--suite", str(nameless), "--out", str(tmp_path / "b")]) == 2
    err = one_line_error(capsys)
    assert "'suite: my-tasks'" in err and "--suite:" not in err


def test_12_a_resume_names_the_flags_the_user_typed(finished_run, suite_run, capsys):
    for extra, typed in ((["--dedupe"], "--dedupe contradicts"), (["--no-baseline"], "--no-baseline contradicts"),
                         (["--suite", str(suite_run.parent / "tiny.yaml")], "it was started without it")):
        assert main(["search", *FLAGS, "--resume", *extra, "--out", str(finished_run)]) == 2
        err = one_line_error(capsys)
        assert typed in err and "strategy_options" not in err and "baseline False" not in err, err
        assert "it has None" not in err


@pytest.mark.parametrize("command, said, wrong", [
    (["validate", "--genes", "dot|sparsemax|none|fixed", "--seeds", "2", "--confidence", "0.5"],
     "--confidence 0.5 is outside (0.5, 1)", "alpha"),
    (["validate", "--genes", "dot|sparsemax|none|fixed", "--seeds", "2", "--power", "2"], "such as 0.8 (80%)", "1%"),
    (["transfer", "--gene", "dot|sparsemax|none|fixed", "--sizes", "16", "--seeds", "0"], "--seeds 0 is too few",
     "5 is the default"),
])
def test_12_a_study_message_is_right(command, said, wrong, tmp_path, capsys):
    assert main([*command, *STUDY_FLAGS, "--out", str(tmp_path / "out")]) == 2
    err = one_line_error(capsys)
    assert said in err and wrong not in err, err


def test_12_an_lr_grid_warning_has_the_tools_format(tmp_path, recwarn):
    assert main(["baseline", *STUDY_FLAGS, "--lr-grid", "1e-3,2e-3", "--tuning-seeds", "1",
                 "--out", str(tmp_path / "b")]) == 0
    edges = [str(w.message) for w in recwarn if "is the grid's" in str(w.message)]
    assert len(edges) == 1 and issubclass(recwarn[0].category, UserWarning)


def test_12_rays_own_log_lines_stay_out_of_a_search(tmp_path, capfd):
    pytest.importorskip("ray")
    assert main(["search", *FLAGS, "--executor", "ray", "--workers", "1", "--out", str(tmp_path / "r")]) == 0
    err = capfd.readouterr().err
    assert "WARNING" not in err and "INFO" not in err, err


# -- item 14: a disk full before the first training: the message and what follows agree -------------------
def test_14_a_disk_full_while_the_run_is_created_says_to_start_again(tmp_path, capsys, monkeypatch):
    import sqlite3

    import evo_attention.search.store as store_module

    def full(value):
        raise sqlite3.OperationalError("database or disk is full")

    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(store_module, "dumps", full)
        assert main(["search", *FLAGS, "--out", str(out)]) == 2
    err = one_line_error(capsys)
    assert "is full: free space, then start the run again with the same command" in err and "--resume" not in err
    assert not (out / "run.db").exists()
    assert main(["search", *FLAGS, "--out", str(out)]) == 0  # the same command, once there is space


def test_15_the_hf_export_builds_its_harness_task_from_local_data_only(tmp_path, monkeypatch):
    """The lm-evaluation-harness task is an extra of the export: its data is never downloaded (offline a
    download attempt waited about 20 s for the network before failing)."""
    import os

    from evo_attention.data.tokenizers import train_tokenizer
    from evo_attention.nn.model import TinyTransformer
    from evo_attention.nn.spec import ModelSpec
    from evo_attention.train import spec
    from evo_attention.train.saving import save_model

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    seen = []

    def load_task(task):
        seen.append((os.environ.get("HF_HUB_OFFLINE"), os.environ.get("HF_DATASETS_OFFLINE")))
        raise UserError("not here")

    monkeypatch.setattr(spec, "load_task", load_task)
    tokenizer = train_tokenizer("word", "the cat sat on the mat .\n" * 8, 16)
    model = TinyTransformer(ModelSpec(vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_layers=1,
                                      max_seq_len=8, dropout=0.0), ["dot|softmax|none|fixed|nobias|0.00"])
    settings = {"data": "wikitext2", "tokenizer": "word", "vocab_size": 16, "d_model": 16, "n_heads": 2, "n_layers": 1,
                "max_seq_len": 8}  # data settings, so that the export builds the task's data
    save_model(model, tmp_path / "model", tokenizer=tokenizer, settings=settings)
    assert main(["export", "--model", str(tmp_path / "model"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert seen == [("1", "1")]  # offline while the data was built ...
    assert "HF_HUB_OFFLINE" not in os.environ and "HF_DATASETS_OFFLINE" not in os.environ  # ... and as before after


@pytest.mark.parametrize("blocker, directory, flags", [
    ("checkpoints", False, []),
    ("checkpoints/generation_000.json", True, []),
    ("fresh_check.json", True, ["--check"]),
    ("models", False, ["--keep-models", "1"]),
])
def test_a_file_or_directory_in_an_outputs_place_is_one_line_and_the_run_resumes(blocker, directory, flags, tmp_path,
                                                                                  capsys, monkeypatch):
    """A file where the run makes a directory, or a directory where it writes a file, ended the search with a
    traceback; it is one line naming the path, then the resume command, and the stored trainings stay."""
    out = tmp_path / "run"
    (out / blocker).mkdir(parents=True) if directory else (out.mkdir(), (out / blocker).write_text("x"))
    if flags == ["--check"]:
        monkeypatch.delenv("EVO_ATTENTION_FRESH_CHECK")
        flags = []
    assert main(["search", *FLAGS, *flags, "--out", str(out)]) == 2
    err = one_line_error(capsys)
    assert f"{out / blocker} is a {'directory' if directory else 'file'}" in err and "move it away" in err, err
    assert err.endswith(f"resume with: evo-attention search --resume --out {out}"), err
    with RunStore.open(out, readonly=True) as store:
        assert store.evaluations()
