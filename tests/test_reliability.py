"""Reliability: one writer per run directory, store and file faults as one-line answers, failures
named right, outputs checked before training (docs/reliability.md)."""

import json
import math
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

from evo_attention import Config, Evolution, Status
from evo_attention.cli import main
from evo_attention.data import data_from_config
from evo_attention.report.status import run_status
from evo_attention.search.lock import LOCK_NAME, RunLock, holder
from evo_attention.search.store import RunStore
from evo_attention.train.trainer import Trainer, train_and_evaluate
from evo_attention.util.errors import UserError

TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 128, "eval_examples": 32},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=32, eval_steps=None,
            learning_rate=3e-3, train_steps=4, log_every=2, population_size=2, n_generations=1, elite_size=1)
FLAGS = ["--preset", "quick", "--vocab-size", "16", "--seq-len", "16", "--d-model", "16", "--heads", "2",
         "--layers", "1", "--batch-size", "8", "--steps", "4", "--population", "2", "--generations", "1",
         "--elite", "1", "--quiet"]


def one_line_error(capsys, *, forbidden=("Traceback", "remove it")) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("evo-attention: error:") and "\n" not in err, err
    for word in forbidden:
        assert word not in err, err
    return err


@pytest.fixture
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    assert main(["search", *FLAGS, "--out", str(out)]) == 0
    return out


# -- ownership -------------------------------------------------------------------------------------
def test_a_second_writer_is_refused_and_the_first_keeps_its_run(tmp_path, capsys):
    out = tmp_path / "run"
    config = Config(**TINY)
    with Evolution(config, out_dir=out) as first:
        before = RunStore.open(out, readonly=True).config()
        for flags in (["--overwrite"], ["--resume"], []):
            assert main(["search", *FLAGS, "--out", str(out), *flags]) == 2
            err = one_line_error(capsys)
            assert "is in use by process" in err and str(first.lock.path.parent) in err
        assert run_status(out)["state"] == "running" and run_status(out)["writer"]["pid"] is not None
        first.run()
        assert RunStore.open(out, readonly=True).config() == before
    assert run_status(out)["state"] == "finished" and holder(out) is None


def test_a_lock_of_a_dead_process_is_taken_over(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": 999999, "host": "gone", "started_at": "yesterday"}))
    assert holder(out) is None  # nobody holds the file lock: the recorded holder is dead
    with RunLock(out) as lock:
        assert lock.held and holder(out)["pid"] is not None


def test_status_says_interrupted_after_a_kill(tmp_path, capsys):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "evo_attention.cli", "search", *FLAGS, "--steps", "400", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and holder(out) is None:
            time.sleep(0.1)
        assert holder(out)["pid"] == proc.pid
        assert main(["status", str(out)]) == 0
        assert f"running (process {proc.pid}" in capsys.readouterr().out
    finally:
        proc.kill()
        proc.wait()
    assert main(["status", str(out)]) == 0
    text = capsys.readouterr().out
    assert "interrupted" in text and f"evo-attention search --resume --out {out}" in text


# -- store and file faults ---------------------------------------------------------------------------
def test_garbage_in_the_store_is_a_one_line_error_everywhere(finished_run, tmp_path, capsys):
    run = tmp_path / "broken"
    shutil.copytree(finished_run, run)
    db = run / "run.db"
    data = bytearray(db.read_bytes())
    data[4096:8192] = b"\xa5" * 4096  # the second page: garbage in the middle of the file
    db.write_bytes(bytes(data))
    for argv in (["status", str(run)], ["report", str(run)], ["search", *FLAGS, "--resume", "--out", str(run)],
                 ["validate", "--from-run", str(run), "--quiet"]):
        assert main(argv) == 2, argv
        err = one_line_error(capsys)
        assert "run.db" in err and ("damaged" in err or "cannot be" in err), err


def test_a_bad_meta_value_is_named(finished_run, tmp_path, capsys):
    run = tmp_path / "edited"
    shutil.copytree(finished_run, run)
    with sqlite3.connect(run / "run.db") as conn:
        conn.execute("UPDATE meta SET value = '{oops' WHERE key = 'data'")
    assert main(["report", str(run)]) == 2
    assert "meta value 'data'" in one_line_error(capsys)


def test_a_full_disk_stops_the_search_with_the_resume_command(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    calls = []

    def full(self, record, **kwargs):
        calls.append(1)
        raise self._fault(sqlite3.OperationalError("database or disk is full"))

    monkeypatch.setattr(RunStore, "record", full)
    assert main(["search", *FLAGS, "--out", str(out)]) == 2
    err = one_line_error(capsys)
    assert "is full" in err and f"resume with: evo-attention search --resume --out {out}" in err and calls
    monkeypatch.undo()
    assert run_status(out)["state"] == "interrupted"  # the lock went with the process's search


def test_a_full_disk_during_the_report_is_one_line(finished_run, capsys, monkeypatch):
    import evo_attention.util.files as files

    def no_space(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files, "write_text", no_space)
    assert main(["report", str(finished_run)]) == 2
    assert "No space left on device" in one_line_error(capsys)


def test_read_only_runs_open_for_reading(finished_run, tmp_path, capsys, monkeypatch):
    import evo_attention.search.store as store_module

    run = tmp_path / "ro"
    shutil.copytree(finished_run, run)
    real = store_module.os.access
    monkeypatch.setattr(store_module.os, "access", lambda path, mode: False if str(run) in str(path) else real(path, mode))
    assert main(["status", str(run)]) == 0 and "finished" in capsys.readouterr().out
    assert main(["search", *FLAGS, "--resume", "--out", str(run)]) == 2
    assert "read-only" in one_line_error(capsys)


def test_run_db_alone_is_a_complete_copy(finished_run, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(finished_run / "run.db", copy / "run.db")  # no -wal, no -shm
    with RunStore.open(copy, readonly=True) as store:
        assert len(store.evaluations()) == 3 and store.get_meta("done") is True


def test_a_lost_log_sends_the_user_one_way(tmp_path, capsys):
    run = tmp_path / "lost"
    store = RunStore.create(run, {"seed": 1})
    empty = tmp_path / "empty"
    empty.mkdir()
    sqlite3.connect(empty / "run.db").close()  # a database file that never got the run's data
    store.close()
    assert main(["search", *FLAGS, "--resume", "--out", str(empty)]) == 2
    err = one_line_error(capsys)
    assert "holds no run yet" in err and "--overwrite" in err
    assert main(["search", *FLAGS, "--out", str(empty)]) == 0  # a new search may use it without --overwrite


def test_a_foreign_sqlite_file_is_named_as_such(tmp_path, capsys):
    (tmp_path / "other").mkdir()
    with sqlite3.connect(tmp_path / "other" / "run.db") as conn:
        conn.execute("CREATE TABLE notes (x)")
    assert main(["status", str(tmp_path / "other")]) == 2
    assert "not an evo-attention run" in one_line_error(capsys)


def test_a_damaged_or_mismatched_model_file_is_named(tmp_path):
    from evo_attention import TinyTransformer
    from evo_attention.train.saving import load_model, save_model

    config = Config(**TINY)
    save_model(TinyTransformer(config, "dot|softmax|none|fixed"), tmp_path / "a")
    save_model(TinyTransformer(config.replace(d_model=32), "dot|softmax|none|fixed"), tmp_path / "b")
    weights = tmp_path / "a" / "model.safetensors"
    shutil.copy(tmp_path / "b" / "model.safetensors", weights)  # the other model's weights
    with pytest.raises(UserError, match="model.safetensors was altered or damaged"):
        load_model(tmp_path / "a")
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    with pytest.raises(UserError, match="model.safetensors was altered or damaged"):
        load_model(tmp_path / "a")
    weights.unlink()
    with pytest.raises(UserError, match="model.safetensors is missing"):
        load_model(tmp_path / "a")
    (tmp_path / "b" / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="config.json is damaged"):
        load_model(tmp_path / "b")


def test_a_closed_output_pipe_ends_quietly(finished_run, monkeypatch, capsys):
    import builtins

    def broken(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(builtins, "print", broken)
    assert main(["status", str(finished_run)]) == 0
    monkeypatch.undo()
    assert capsys.readouterr().err == ""


# -- failures named right ----------------------------------------------------------------------------
@pytest.mark.parametrize("gene", ["dot|sparsemax|none|fixed|bias|0.00", "dot|entmax15|none|fixed|bias|0.00",
                                  "dot|softmax|none|fixed|bias|0.00"])
def test_divergence_is_diverged_with_its_step_and_reason(gene):
    config = Config(**{**TINY, "learning_rate": 1e4, "train_steps": 8})
    record = train_and_evaluate(gene, config, data_from_config(config))
    assert record.status is Status.DIVERGED, (record.status, record.error)
    assert record.error and "step" in record.error and "index" not in record.error
    assert math.isnan(record.val_loss) or record.val_loss > math.log(16)


def test_an_absurd_finite_loss_is_diverged(monkeypatch):
    config = Config(**TINY)
    monkeypatch.setattr(Trainer, "_step", lambda self, x, y: __import__("torch").tensor(19000.0))
    record = train_and_evaluate("dot|softmax|none|fixed", config, data_from_config(config))
    assert record.status is Status.DIVERGED and "far above a uniform guess" in record.error


def test_a_cpu_allocation_failure_is_oom(monkeypatch):
    config = Config(**TINY)

    def no_memory(self, x, y):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 1099511627776 bytes")

    monkeypatch.setattr(Trainer, "_step", no_memory)
    assert train_and_evaluate("dot|softmax|none|fixed", config, data_from_config(config)).status is Status.OOM


@pytest.mark.parametrize("flags, fragment", [(["--lr", "inf"], "--lr must be a positive number"),
                                             (["--seed", str(2**70)], "--seed must be an integer in 0..2^63-1"),
                                             (["--gene", ""], "cannot parse gene ''")])
def test_impossible_values_are_refused_before_training(flags, fragment, tmp_path, capsys):
    assert main(["baseline", *FLAGS[:2], *flags, "--out", str(tmp_path / "b"), "--quiet"]) == 2
    assert fragment in one_line_error(capsys)
    assert not (tmp_path / "b" / "result.json").exists()


# -- outputs first -----------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["baseline"], ["compare", "--configs", "baseline"],
                                     ["validate", "--genes", "dot|sparsemax|none|fixed", "--seeds", "2"],
                                     ["ablate", "--gene", "dot|sparsemax|none|fixed", "--seeds", "2"],
                                     ["attention-maps", "--gene", "dot|sparsemax|none|fixed"]])
def test_an_unwritable_output_fails_before_training(command, tmp_path, capsys, monkeypatch):
    import evo_attention.search.executors.base as base

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setattr(base, "run_training", lambda *a, **k: pytest.fail("trained before checking the output"))
    monkeypatch.setattr("evo_attention.train.trainer.run_training",
                        lambda *a, **k: pytest.fail("trained before checking the output"))
    assert main([*command, "--preset", "quick", "--steps", "2", "--out", str(blocker / "out"), "--quiet"]) == 2
    assert "cannot create output directory" in one_line_error(capsys)


# -- the seed README's quick start and smaller items --------------------------------------------------
def test_the_original_quick_start_runs_as_written(tmp_path):
    from evo_attention.utils import get_dataloaders, get_device, set_seed

    config = Config(vocab_size=32, max_seq_len=32, d_model=16, n_heads=2, n_layers=1, train_steps=2,
                    population_size=2, n_generations=1, elite_size=1, batch_size=8, eval_batch_size=32,
                    device=get_device())
    assert config.device == str(get_device())
    set_seed(config.seed)
    train_loader, eval_loader = get_dataloaders(config.vocab_size, config.max_seq_len, config.batch_size,
                                                config.eval_batch_size, use_wikitext=False)
    evolution = Evolution(config, train_loader, eval_loader, out_dir=tmp_path / "run")
    best = evolution.run()
    print(best.gene, best.perplexity, best.fitness)
    evolution.save_results(tmp_path / "results")
    evolution.plot_history(tmp_path / "results" / "evolution_progress.png")
    evolution.close()
    assert (tmp_path / "results" / "final_results.json").is_file()


def test_yaml_scientific_notation_is_a_number(tmp_path):
    from evo_attention.train.presets import build_config

    path = tmp_path / "c.yaml"
    path.write_text("learning_rate: 1e-3\nweight_decay: 5e-2\n")
    config = build_config(config_file=path)
    assert config.learning_rate == 1e-3 and config.weight_decay == 0.05


@pytest.mark.parametrize("settings, fragment", [
    ({"search_space": {"normalization": []}}, "option list for normalization is empty"),
    ({"search_space": {"qkv_rank": [0, 32]}, "d_model": 16, "n_heads": 2}, "qkv_rank 32 in the search space is larger"),
])
def test_empty_or_impossible_search_spaces_are_refused(settings, fragment):
    with pytest.raises(UserError, match=fragment):
        Config(**settings).space()


def test_a_config_directory_and_smaller_compare_defaults(tmp_path, capsys):
    from evo_attention.studies.compare import settings_for

    assert main(["search", "--config", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    assert "is a directory" in one_line_error(capsys)
    assert settings_for(None, {"d_model": 32})["d_ff"] is None
    assert settings_for(None, {"data": "recall"})["vocab_size"] is None
    assert settings_for(None, {"data": "recall", "vocab_size": 40})["vocab_size"] == 40


def test_the_report_title_escapes_html(tmp_path):
    from evo_attention.report import write_report

    run = tmp_path / "<b>x"
    RunStore.create(run, Config(**TINY).to_dict()).close()
    write_report(run)
    title = (run / "report.md").read_text().splitlines()[0]
    assert "<b>" not in title and "&lt;b&gt;" in title
