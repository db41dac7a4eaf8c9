"""Reliability: one writer per run directory, store and file faults as one-line answers, failures
named right, outputs checked before training (docs/reliability.md)."""

import json
import math
import shutil
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from evo_attention import Config, Evolution, Status
from evo_attention.cli import main
from evo_attention.data import data_from_config
from evo_attention.report.status import run_status
from evo_attention.search.lock import LOCK_NAME, RunLock, holder
from evo_attention.search.store import RunStore
from evo_attention.train.trainer import Member, Trainer, train_and_evaluate
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


def _readable(out) -> bool:
    try:
        run_status(out)
        return True
    except UserError:
        return False


def test_status_says_interrupted_after_a_kill(tmp_path, capsys):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "evo_attention.cli", "search", *FLAGS, "--steps", "400", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and (holder(out) is None or not _readable(out)):
            time.sleep(0.1)  # the lock comes first, then the store: wait for both
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


def test_a_store_deleted_during_the_search_stops_it_at_the_next_write_without_a_resume(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    record, written = RunStore.record, []

    def record_then_delete(self, *args, **kwargs):
        written.append(record(self, *args, **kwargs))
        self.path.unlink(missing_ok=True)  # `rm run.db` after the first result
        return written[-1]

    monkeypatch.setattr(RunStore, "record", record_then_delete)
    assert main(["search", *FLAGS, "--no-check", "--out", str(out)]) == 2
    err = one_line_error(capsys)
    assert "run.db was deleted or replaced while this run wrote it" in err and "resume" not in err
    assert len(written) == 1  # nothing trained after it was noticed


def test_a_full_disk_during_the_report_is_one_line(finished_run, capsys, monkeypatch):
    import evo_attention.util.files as files

    def no_space(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files, "write_text", no_space)
    assert main(["report", str(finished_run)]) == 2
    assert "No space left on device" in one_line_error(capsys)


@pytest.mark.parametrize("command", ["report", "search"])
def test_a_run_moved_while_its_report_is_written_is_said_gone_not_resumed(command, tmp_path, capsys, monkeypatch):
    import evo_attention.util.files as files

    run, write_text = tmp_path / "run", files.write_text
    search = ["search", *FLAGS, "--no-check", "--out", str(run)]
    if command == "report":
        assert main(search) == 0
        capsys.readouterr()

    def move_then_write(path, text):
        if Path(path).name == "final_results.json":  # the report's first file
            run.rename(tmp_path / "moved")
        return write_text(path, text)

    monkeypatch.setattr(files, "write_text", move_then_write)
    assert main(["report", str(run)] if command == "report" else search) == 2
    err = one_line_error(capsys)
    assert f"{run} was moved or deleted while its report was written: the run is no longer there" in err
    assert "resume" not in err and "free space" not in err and (tmp_path / "moved" / "run.db").is_file()


@pytest.mark.parametrize("when", ["loading", "writing"])
def test_a_run_replaced_by_another_while_its_report_is_written_says_so(when, finished_run, tmp_path, capsys,
                                                                       monkeypatch):
    import evo_attention.report as report
    import evo_attention.util.files as files

    run, other, moved = tmp_path / "run", tmp_path / "other", tmp_path / "moved"
    for copy in (run, other):
        shutil.copytree(finished_run, copy)
        (copy / LOCK_NAME).unlink(missing_ok=True)
    for name in ("final_results.json", "report.md"):
        (other / name).write_text("the other run's")
    read_studies, write_text = report.read_studies, files.write_text

    def swap():
        run.rename(moved)
        other.rename(run)

    def swap_then_read(run_dir):  # after the run is loaded, before a file is written
        swap()
        return read_studies(run_dir)

    def swap_then_write(path, text):  # the report's first file: the rest go into the other run's directory
        if Path(path).name == "final_results.json":
            swap()
        return write_text(path, text)

    if when == "loading":
        monkeypatch.setattr(report, "read_studies", swap_then_read)
    else:
        monkeypatch.setattr(files, "write_text", swap_then_write)
    assert main(["report", str(run)]) == 2
    err = one_line_error(capsys)
    assert (f"{run} was moved or replaced while its report was written: the run is no longer there, and {run} now "
            "holds another run") in err and "; if this run was moved, write its report from its new directory" in err
    assert "resume" not in err and (moved / "run.db").is_file()
    assert (run / "report.md").read_text() == "the other run's"  # the text reports are written after the check
    if when == "loading":
        assert "(none of its files touched)" in err and (run / "final_results.json").read_text() == "the other run's"
    else:
        assert ", whose report files this run's overwrote: write that run's report again" in err


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


def test_a_nan_validation_loss_is_diverged(monkeypatch):
    config = Config(**TINY)
    evaluate = Member.evaluate
    monkeypatch.setattr(Member, "evaluate", lambda self, *a, **k: {**evaluate(self, *a, **k), "val_loss": math.nan})
    record = train_and_evaluate("dot|softmax|none|fixed", config, data_from_config(config))
    assert record.status is Status.DIVERGED and record.error == "non-finite validation loss"


def test_a_cpu_allocation_failure_is_oom(monkeypatch):
    config = Config(**TINY)

    def no_memory(self, x, y):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 1099511627776 bytes")

    monkeypatch.setattr(Trainer, "_step", no_memory)
    assert train_and_evaluate("dot|softmax|none|fixed", config, data_from_config(config)).status is Status.OOM


@pytest.mark.parametrize("flags, fragment", [(["--lr", "inf"], "--lr must be a positive number"),
                                             (["--seed", str(2**70)], "--seed must be an integer in 0..2^63-1"),
                                             (["--gene", ""], "--gene is empty")])
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
    err = one_line_error(capsys)
    assert "cannot create output directory" in err or f"{blocker} is a file, not a directory" in err


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
    assert settings_for(None, {"data": "recall", "vocab_size": 40})["vocab_size"] == 40


@pytest.mark.parametrize("data, flags, vocab", [
    ("recall", [], 64), ("mqar:seq_len=32,pairs=4", [], 64), ("recall", ["--vocab-size", "40"], 40),
    ("recall", ["--preset", "quick"], 32), ("mqar:seq_len=32,pairs=4,vocab=24", ["--vocab-size", "40"], 24),
])
def test_every_command_trains_a_generated_task_at_one_vocabulary(data, flags, vocab):
    # the word corpora's default 10000 is never a generated task's vocabulary, whichever command reads the flags
    from evo_attention.cli import build_parser
    from evo_attention.cli.common import config_from_args, explicit_settings
    from evo_attention.data import data_from_config
    from evo_attention.studies.compare import settings_for
    from evo_attention.train.config import Config
    from evo_attention.train.presets import build_config

    args = build_parser().parse_args(["baseline", "--data", data, *flags])
    compare = Config.from_dict(settings_for(None, explicit_settings(args)))
    preset = "quick" if "quick" in flags else None
    overrides = {"data": data, **({"vocab_size": int(flags[1])} if "--vocab-size" in flags else {})}
    for config in (config_from_args(args), compare, build_config(preset, overrides=overrides)):
        assert data_from_config(config).vocab_size == vocab


def test_a_recall_run_stored_at_the_corpora_vocabulary_resumes_with_its_flags(tmp_path):
    # a run made when --data recall trained at 10000 keeps it: the implied vocabulary is no typed setting
    from evo_attention.cli import build_parser
    from evo_attention.cli.search import search_config
    from evo_attention.search.store import RunStore
    from evo_attention.train.config import Config

    RunStore.create(tmp_path / "r", Config(data="recall", d_model=16, n_heads=2).to_dict()).close()
    args = build_parser().parse_args(["search", "--resume", "--out", str(tmp_path / "r"), "--data", "recall",
                                      "--d-model", "16", "--heads", "2"])
    assert search_config(args).vocab_size == 10000


def test_the_report_title_escapes_html(tmp_path):
    from evo_attention.report import write_report

    run = tmp_path / "<b>x"
    RunStore.create(run, Config(**TINY).to_dict()).close()
    write_report(run)
    title = (run / "report.md").read_text().splitlines()[0]
    assert "<b>" not in title and "&lt;b&gt;" in title


# -- Reliability 2 (issue 33): each numbered item ---------------------------------------------------
def _no_training(monkeypatch):
    import evo_attention.search.executors.base as base

    monkeypatch.setattr(base, "run_training", lambda *a, **k: pytest.fail("trained although a setting does not apply"))


def test_2_a_metric_the_data_cannot_give_is_refused_before_training(finished_run, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "validation.json").write_text('{"kept": true}')
    _no_training(monkeypatch)
    assert main(["validate", "--from-run", str(run), "--metric", "bits_per_byte", "--seeds", "2", "--quiet"]) == 2
    err = one_line_error(capsys)
    assert "--metric bits_per_byte does not apply to the recall data" in err and "val_perplexity" in err
    assert json.loads((run / "validation.json").read_text()) == {"kept": True}


@pytest.mark.parametrize("flags, fragment", [
    (["--data-dir", "/somewhere"], "--data-dir '/somewhere' does not apply to data 'recall'"),
    (["--text-field", "body"], "--text-field 'body' does not apply to data 'recall'"),
    (["--tokenizer", "char"], "--tokenizer 'char' applies to text corpora"),
    (["--eval-stride", "8"], "--eval-stride 8 does not apply to the recall task")])
def test_3_settings_the_recall_data_does_not_use_are_refused(flags, fragment, tmp_path, capsys, monkeypatch):
    _no_training(monkeypatch)
    assert main(["search", *FLAGS, *flags, "--out", str(tmp_path / "run")]) == 2
    assert fragment in one_line_error(capsys)
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


def test_3_a_corpus_refuses_a_text_field_and_an_old_recall_run_still_resumes(finished_run, tmp_path, capsys):
    from evo_attention.data import load_data

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_text("the cat sat on the mat\n" * 20)
    with pytest.raises(UserError, match="text_field 'body' does not apply to data 'text'"):
        load_data("text", data_dir=corpus, text_field="body", seq_len=8)
    run = tmp_path / "old"
    shutil.copytree(finished_run, run)
    with sqlite3.connect(run / "run.db") as conn:  # a run stored by a version that ignored data_dir on recall
        config = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()[0])
        conn.execute("UPDATE meta SET value = ? WHERE key = 'config'", (json.dumps({**config, "data_dir": "/gone"}),))
    assert main(["search", *FLAGS, "--resume", "--out", str(run)]) == 0


def test_4_a_gpu_request_that_cannot_be_met_is_refused_before_ray_starts(tmp_path, capsys, monkeypatch):
    ray = pytest.importorskip("ray")
    import evo_attention.search.executors.ray as ray_executor

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started for a request it can never meet"))
    monkeypatch.setattr(ray_executor, "local_gpus", lambda: 0, raising=False)  # a machine without a GPU
    assert main(["search", *FLAGS, "--executor", "ray", "--gpus-per-trial", "1", "--out", str(tmp_path / "r")]) == 2
    assert "--gpus-per-trial 1 cannot be met: this machine has no GPU" in one_line_error(capsys)
    assert main(["search", *FLAGS, "--executor", "ray", "--cpus-per-trial", "4096", "--out", str(tmp_path / "r")]) == 2
    assert "--cpus-per-trial 4096 cannot be met" in one_line_error(capsys)
    # a cluster is asked once Ray is connected
    monkeypatch.setattr(ray, "init", lambda *a, **k: None)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    executor = ray_executor.RayExecutor("10.0.0.1:6379", gpus_per_trial=1)
    with pytest.raises(UserError, match="gpus_per_trial 1 cannot be met: the Ray cluster at 10.0.0.1:6379 has no GPU"):
        executor._open()
    # a cluster with GPUs and trials that ask for none: said in one line, not silently trained on CPUs
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0, "GPU": 2.0})
    with pytest.warns(UserWarning, match="has 2 GPUs and gpus_per_trial is 0: every trial trains on CPUs"):
        ray_executor.RayExecutor("10.0.0.1:6379")._check_resources(ray.cluster_resources(), "the Ray cluster")
    monkeypatch.setattr(ray_executor, "local_gpus", lambda: 1, raising=False)
    with pytest.warns(UserWarning, match="this machine has 1 GPU and gpus_per_trial is 0"):
        ray_executor.RayExecutor()


def test_5_deleting_run_lock_during_a_live_search_frees_nothing(tmp_path, capsys):
    import os

    out = tmp_path / "run"
    with Evolution(Config(**TINY), out_dir=out) as first:
        (out / LOCK_NAME).unlink()  # a user "cleaning up" while the search runs
        assert run_status(out)["state"] == "running" and holder(out)["pid"] == os.getpid()
        for flags in (["--resume"], ["--overwrite"]):
            assert main(["search", *FLAGS, "--out", str(out), *flags]) == 2
            assert f"is in use by process {os.getpid()}" in one_line_error(capsys)
        (out / LOCK_NAME).write_text("{}")  # replaced by another file
        assert run_status(out)["state"] == "running"
        first.run()  # the writer puts its run.lock back after an evaluation
        assert holder(out)["pid"] == os.getpid() and holder(out)["started_at"]
        assert main(["status", str(out)]) == 0 and "running (process" in capsys.readouterr().out
    assert run_status(out)["state"] == "finished" and holder(out) is None
    assert main(["search", "--resume", "--quiet", "--out", str(out)]) == 0  # free again once the writer ended


def test_6_a_sequence_length_beyond_memory_is_one_line(tmp_path, capsys, monkeypatch):
    import evo_attention.data.recall as recall
    import evo_attention.util.memory as memory

    assert main(["search", *FLAGS, "--seq-len", "2000000000", "--out", str(tmp_path / "r")]) == 2
    err = one_line_error(capsys)
    assert "needs about" in err and "--seq-len" in err and not (tmp_path / "r").exists()
    monkeypatch.setattr(memory, "available_memory", lambda: None)  # unknown: the allocation itself fails

    def no_memory(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(recall, "generate", no_memory)
    assert main(["search", *FLAGS, "--seq-len", "2000000", "--out", str(tmp_path / "r")]) == 2
    assert "the allocation failed" in one_line_error(capsys)


def test_6_sigterm_under_ray_ends_with_the_resume_command(tmp_path):
    import os
    import signal

    pytest.importorskip("ray")
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [sys.executable, "-m", "evo_attention.cli", "search", *FLAGS, "--steps", "100000", "--executor", "ray",
           "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if (out / "run.db").exists() and run_status(out)["workers"]:  # Ray is up and a task trains
                break
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "SIGTERM received" not in err and "Traceback" not in err
    assert f"resume with: evo-attention search --resume --out {out}" in err


# Ctrl-C once a training is stored; again while the store closes (as while Ray shuts down); again as the process exits
CTRL_C_THRICE = """
import atexit, os, signal, sys
import evo_attention.search.executors.base as base
from evo_attention.cli import main
from evo_attention.search.store import RunStore

ctrl_c = lambda: os.kill(os.getpid(), signal.SIGINT)
run, close, pressed = base.LocalExecutor.run, RunStore.close, []

def interrupted(self, tasks, **kw):
    for task, record in run(self, tasks, **kw):
        yield task, record  # the runner stores it before asking for the next
        pressed.append(1)
        ctrl_c()

def closing(self):
    if pressed and not self.readonly and self._conn is not None:
        ctrl_c()
    close(self)

base.LocalExecutor.run, RunStore.close = interrupted, closing
atexit.register(ctrl_c)
sys.exit(main())
"""


def test_6_ctrl_c_again_while_the_first_is_handled_is_ignored(tmp_path):
    """The fix is in the command's signal handling, the same for every executor: shown with the local
    one (``test_6_sigterm_under_ray...`` shows Ray's first interrupt; a Ray start takes a minute here)."""
    import os

    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", CTRL_C_THRICE, "search", *FLAGS, "--out", str(out)],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"evo-attention: interrupted; every finished evaluation is saved in {out / 'run.db'}.",
        f"resume with: evo-attention search --resume --out {out}"], proc.stderr  # once, and no traceback
    assert (out / LOCK_NAME).read_text() == ""  # the cleanup ran to its end: the store closed, the lock let go
    with RunStore.open(out, readonly=True) as store:
        assert [r["status"] for r in store.evaluations()] == ["ok"]  # the training stored before the first Ctrl-C


def _corpus(directory, valid_words=None):
    directory.mkdir(parents=True, exist_ok=True)
    text = "the cat sat on the mat and the dog ran to the park with a ball\n" * 60
    for split in ("train", "valid", "test"):
        (directory / f"{split}.txt").write_text(text if valid_words is None or split == "train" else valid_words)
    return directory


def _warning_lines(err):
    lines = [line for line in err.splitlines() if "warning:" in line or "Warning" in line]
    for line in lines:
        assert line.startswith("evo-attention: warning: "), line
        assert "UserWarning" not in line and ".py:" not in line, line
    assert not [line for line in err.splitlines() if line.startswith("  ")], err  # no source line
    return lines


def _cli(*args, env=None):
    """Run the command in a process of its own: what a user's terminal shows (stderr)."""
    import os

    return subprocess.run([sys.executable, "-m", "evo_attention.cli", *map(str, args)], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, timeout=600)


def test_6_warnings_are_one_line_for_users(tmp_path):
    plugin = tmp_path / "failing_tracker.py"  # a tracker whose server is down
    plugin.write_text(
        "from evo_attention.search import trackers\n"
        "class Failing(trackers.Tracker):\n"
        "    name = 'failing'\n"
        "    def start(self, run_name, config):\n"
        "        raise ConnectionError('the tracking server is down')\n"
        "trackers.make_tracker = lambda spec, out: trackers.Guarded(Failing())\n")
    done = _cli("search", *FLAGS, "--plugin", plugin, "--track", "anything", "--out", tmp_path / "run")
    assert done.returncode == 0, done.stderr
    lines = _warning_lines(done.stderr)
    assert any("tracker failing failed (ConnectionError: the tracking server is down)" in line for line in lines)

    from evo_attention.data import load_data

    corpus = _corpus(tmp_path / "corpus")
    cache = tmp_path / "cache"
    text = ["baseline", "--data", "text", "--data-dir", corpus, "--vocab-size", "full", "--seq-len", "8",
            "--d-model", "16", "--heads", "2", "--layers", "1", "--steps", "2", "--batch-size", "4", "--quiet"]
    assert _cli(*text, "--out", tmp_path / "b1", env={"EVO_ATTENTION_CACHE_DIR": str(cache)}).returncode == 0
    key = load_data("text", data_dir=corpus, seq_len=8, cache_dir=cache).fingerprint
    (cache / f"tokens-{key}.pt").write_bytes(b"damaged")
    done = _cli(*text, "--out", tmp_path / "b2", env={"EVO_ATTENTION_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr
    assert any("ignoring unreadable cache file" in line for line in _warning_lines(done.stderr))


@pytest.mark.parametrize("out, fragment", [("file", "is not a directory: give the path of a directory as --out"),
                                           ("", "--out is empty")])
@pytest.mark.parametrize("command", [["search", *FLAGS], ["baseline", "--preset", "quick", "--steps", "2", "--quiet"]])
def test_7_an_out_that_is_a_file_or_empty_is_named(command, out, fragment, tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.chdir(tmp_path)
    _no_training(monkeypatch)
    monkeypatch.setattr("evo_attention.train.trainer.run_training", lambda *a, **k: pytest.fail("trained"))
    assert main([*command, "--out", out]) == 2
    err = one_line_error(capsys)
    assert fragment in err and "File exists" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written into the current directory


def test_7_yaml_values_are_named_by_key_and_file_and_duplicates_refused(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("population_size: 4.5\n")
    assert main(["search", "--config", str(bad), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = one_line_error(capsys)
    assert f"population_size must be a positive integer, got 4.5 (population_size is set in config file {bad})" in err
    assert "--population" not in err
    assert main(["search", "--config", str(bad), "--population", "4", "--elite", "1", "--steps", "2",
                 "--generations", "1", "--preset", "quick", "--out", str(tmp_path / "ok"), "--quiet"]) == 0
    capsys.readouterr()
    twice = tmp_path / "twice.yaml"
    twice.write_text("population_size: 4\nlearning_rate: 1e-3\npopulation_size: 6\n")
    assert main(["search", "--config", str(twice), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert f"config file {twice} sets population_size twice (lines 1 and 3)" in one_line_error(capsys)
    nested = tmp_path / "nested.yaml"
    nested.write_text("recall:\n  num_pairs: 2\n  num_pairs: 3\n")
    assert main(["search", "--config", str(nested), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert "sets num_pairs twice (lines 2 and 3)" in one_line_error(capsys)


@pytest.mark.parametrize("flags, fragment", [
    (["--budget", "-1"], "--budget must be a positive integer, got -1"),
    (["--warmup", "-3"], "--warmup must be a non-negative integer, got -3"),
    (["--tokens-per-step", "0"], "--tokens-per-step must be a positive integer, got 0"),
    (["--genes", "softmax"], "--genes applies to long-context mode only"),
    (["--seq-lens", "8", "--genes", "mine=not-a-gene"], "--genes item 'mine=not-a-gene': cannot parse gene"),
    (["--seq-lens", "8", "--genes", "=dot|softmax|none|fixed"], "needs a name and a gene")])
def test_7_bench_names_its_own_flags_and_refuses_what_does_not_apply(flags, fragment, capsys, monkeypatch):
    import evo_attention.train.bench as bench

    monkeypatch.setattr(bench, "bench_gene", lambda *a, **k: pytest.fail("timed although a flag was refused"))
    monkeypatch.setattr(bench, "bench_lengths", lambda *a, **k: pytest.fail("timed although a flag was refused"))
    assert main(["bench", "--preset", "quick", *flags]) == 2
    err = one_line_error(capsys)
    assert fragment in err and "--steps" not in err


def test_7_a_plugin_that_exits_is_an_error_not_a_silent_end(tmp_path, capsys, monkeypatch):
    from evo_attention.train.spec import Trial
    from evo_attention.train.trainer import run_training

    plugin = tmp_path / "exiting.py"
    plugin.write_text("import sys\nsys.exit(3)\n")
    assert main(["search", *FLAGS, "--plugin", str(plugin), "--out", str(tmp_path / "r")]) == 2
    assert "called sys.exit(3) while it was imported" in one_line_error(capsys)

    def exits(self, x, y):  # a plugin component that exits while it trains
        raise SystemExit(3)

    monkeypatch.setattr(Trainer, "_step", exits)
    config = Config(**TINY)
    data = data_from_config(config)
    record = run_training(Trial.from_config("dot|softmax|none|fixed", config, data=data), data).record
    assert record.status == "error" and "sys.exit(3)" in record.error


def test_7_a_bpe_size_the_text_cannot_give_and_a_tiny_validation_split_warn(tmp_path):
    pytest.importorskip("tokenizers")
    from evo_attention.data import load_data

    corpus = _corpus(tmp_path / "corpus", valid_words="two words\n")
    with pytest.warns(UserWarning) as caught:
        data = load_data("text", data_dir=corpus, seq_len=8, tokenizer="bpe:99999999")
    messages = [str(w.message) for w in caught]
    assert any(f"bpe:99999999 asked for 99,999,999 tokens" in m and f"only {data.vocab_size:,}" in m for m in messages)
    assert any("the valid split of" in m and "scored tokens" in m for m in messages)


class _ClosedStream:
    """A stderr whose reader goes away after ``lines`` writes."""

    def __init__(self, lines: int, error):
        self.left, self.error = lines, error

    def write(self, text):
        if self.left <= 0:
            raise self.error
        self.left -= 1
        return len(text)

    def flush(self):
        if self.left <= 0:
            raise self.error

    def isatty(self):
        return False


@pytest.mark.parametrize("error", [BrokenPipeError(32, "Broken pipe"), OSError(5, "Input/output error")])
def test_7_a_closed_progress_pipe_never_stops_a_search(error, tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr(sys, "stderr", _ClosedStream(1, error))
    assert main(["search", *[f for f in FLAGS if f != "--quiet"], "--out", str(out)]) == 0
    monkeypatch.undo()
    assert run_status(out)["state"] == "finished" and run_status(out)["trained"] == 3


def test_7_search_piped_into_head_finishes(tmp_path):
    import os

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "evo_attention.cli", "search", *[f for f in FLAGS if f != "--quiet"], "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    proc.stdout.readline()  # `| head -1`: one line, then the reader is gone
    proc.stdout.close()
    assert proc.wait(timeout=300) == 0
    assert run_status(out)["state"] == "finished"


def test_8_a_step_count_no_run_could_finish_is_refused(tmp_path, capsys):
    assert main(["search", *FLAGS, "--steps", str(10**23), "--out", str(tmp_path / "r")]) == 2
    err = one_line_error(capsys)
    assert "--steps 100,000,000,000,000,000,000,000 is beyond 1,000,000,000" in err and not (tmp_path / "r").exists()
    Config(**{**TINY, "train_steps": 10**9})  # the bound itself is allowed


def test_8_generate_streams_its_text(tmp_path, capsys, monkeypatch):
    import io

    import evo_attention.nn.decoding as decoding

    corpus = _corpus(tmp_path / "corpus")
    assert main(["baseline", "--data", "text", "--data-dir", str(corpus), "--vocab-size", "full", "--seq-len", "8",
                 "--d-model", "16", "--heads", "2", "--layers", "1", "--steps", "2", "--batch-size", "4",
                 "--save-model", "--out", str(tmp_path / "b"), "--quiet"]) == 0
    capsys.readouterr()
    out = io.StringIO()
    seen = []
    real = decoding.sample

    def sample(*args, **kwargs):
        seen.append(out.getvalue())  # what the user had read when this token was drawn
        return real(*args, **kwargs)

    monkeypatch.setattr(decoding, "sample", sample)
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["generate", "--model", str(tmp_path / "b" / "model"), "--prompt", "the cat", "--max-new-tokens", "6",
                 "--seed", "1"]) == 0
    text = out.getvalue()
    assert seen[0] == "the cat" and all(len(b) > len(a) for a, b in zip(seen, seen[1:]))  # a token at a time
    assert text.endswith("\n") and len(text.split()) == 2 + 6 and text.startswith(seen[-1])


def test_8_the_stream_waits_for_a_whole_character():
    from evo_attention.cli.generate import TextStream

    class Bytes:
        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        stream = TextStream(Bytes(), list(b"caf"))
        stream.add(0xC3)
        assert out.getvalue() == "caf"  # half of an e-acute: nothing yet
        stream.add(0xA9)
        assert out.getvalue() == "café"
        stream.add(0xE2)
        stream.close()
    assert out.getvalue() == "café\ufffd\n"


def test_8_resuming_with_other_threads_warns_that_later_digits_may_move(tmp_path, monkeypatch):
    import torch

    from evo_attention.search.executors import LocalExecutor

    out = tmp_path / "run"
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    with Evolution(Config(**{**TINY, "n_generations": 2}), out_dir=out) as evo:
        evo.run()
    with RunStore.open(out) as store:
        assert store.get_meta("training_threads") == 1
        store.set_meta("done", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same threads: nothing to say
        with Evolution(Config(**{**TINY, "n_generations": 2}), out_dir=out, resume=True) as evo:
            evo.run()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    with pytest.warns(UserWarning, match="so far used 1 CPU thread each, this session's use 3"):
        with Evolution(Config(**{**TINY, "n_generations": 2}), out_dir=out, resume=True,
                       executor=LocalExecutor()) as evo:
            evo.run()


def test_8_resuming_with_another_batch_models_warns_in_one_line(tmp_path):
    out = tmp_path / "run"
    with Evolution(Config(**{**TINY, "n_generations": 2, "batch_models": "off"}), out_dir=out) as evo:
        evo.run()
    with RunStore.open(out) as store:
        store.set_meta("done", False)
    with pytest.warns(UserWarning) as seen:
        with Evolution(Config(**{**TINY, "n_generations": 2, "batch_models": 2}), out_dir=out, resume=True) as evo:
            evo.run()
    said = [str(w.message) for w in seen if "batch_models" in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0]
    assert "trained with batch_models off, this session's with 2" in said[0] and "amplifies" in said[0]
