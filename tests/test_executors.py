"""Executors: worker processes and Ray give the local executor's results, dead workers are
replaced and retried, a run resumes under another executor, bad settings are one-line errors."""

import json
import sys
from pathlib import Path

import pytest
import torch

from evo_attention import Config
from evo_attention.cli import main
from evo_attention.data import LoaderData, data_from_config
from evo_attention.util.errors import UserError
from evo_attention import Evolution
from evo_attention.search.executors import (EvalTask, LocalExecutor, ProcessExecutor, RayExecutor, executor_for,
                                           make_executor)
from evo_attention.search.executors.base import plan_batches
from evo_attention.search.runner import Runner
from evo_attention.search.store import RunStore
from evo_attention.train.spec import Trial, provide_task

TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=64, eval_steps=None,
            learning_rate=3e-3, train_steps=6, log_every=3, population_size=4, n_generations=3, elite_size=1)
KEYS = ("best_gene", "best_perplexity", "best_generation", "history", "top_5")


def _final(run_dir):
    data = json.loads((Path(run_dir) / "final_results.json").read_text())
    return {key: data[key] for key in KEYS}


def _search(out, executor, **changes):
    with Evolution(Config(**{**TINY, **changes}), out_dir=out, executor=executor) as evo:
        evo.run()
    return _final(out)


class Watch:
    """Wraps an executor: notes which workers started, reported progress and finished tasks, and
    interrupts the search after ``stop_after`` finished evaluations."""

    def __init__(self, executor, stop_after=None):
        self.inner, self.stop_after, self.seen = executor, stop_after, 0
        self.name, self.workers = executor.name, executor.workers
        self.started, self.stepped, self.finished = set(), set(), set()

    def describe(self):
        return self.inner.describe()

    def run(self, tasks, on_start=None, on_step=None):
        def start(task):
            self.started.add(task.worker)
            on_start(task)

        def step(task, *progress):
            self.stepped.add(task.worker)
            on_step(task, *progress)

        for task, record in self.inner.run(tasks, on_start=start, on_step=step):
            self.finished.add(task.worker)
            yield task, record
            self.seen += 1
            if self.stop_after is not None and self.seen >= self.stop_after:
                raise KeyboardInterrupt

    def close(self):
        self.inner.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture(scope="module")
def one_thread():
    """Every evaluation runs on one thread, as each of 2 workers on a 2-core machine does (CPU
    float reductions may depend on the thread count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, one_thread):
    out = tmp_path_factory.mktemp("local")
    return {"full": _search(out / "full", LocalExecutor()),
            "halving": _search(out / "halving", LocalExecutor(), fidelity="halving", train_steps=18)}


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[distributed]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


# -- choosing an executor ----------------------------------------------------------------------------
def test_make_executor_and_bad_settings():
    assert isinstance(make_executor(), LocalExecutor)
    assert isinstance(make_executor("local", workers=2), ProcessExecutor)
    assert make_executor("local", workers=2, cpus_per_trial=1).threads == 1
    from evo_attention.cli.common import user_message

    # the library names its arguments; the command line speaks of the same settings as flags
    for kwargs, fragment, cli in [
            ({"name": "dask"}, "unknown executor 'dask'", "unknown executor 'dask'"),
            ({"workers": 0}, "workers must be a positive integer", "--workers must be a positive integer"),
            ({"address": "1.2.3.4:6379"}, "address needs executor ray", "--ray-address needs --executor ray"),
            ({"workers": 2, "gpus_per_trial": 1}, "gpus_per_trial applies to executor ray",
             "--gpus-per-trial applies to --executor ray"),
            ({"cpus_per_trial": 2}, "cpus_per_trial needs workers", "--cpus-per-trial needs --workers"),
            ({"name": "ray", "workers": 2, "address": "auto"}, "drop workers", "drop --workers"),
            ({"name": "ray", "cpus_per_trial": 0}, "cpus_per_trial must be a positive",
             "--cpus-per-trial must be a positive")]:
        with pytest.raises(UserError, match=fragment) as info:
            make_executor(**kwargs)
        assert "\n" not in str(info.value) and "--" not in str(info.value)
        assert cli in user_message(info.value)


def test_executor_for_a_config_takes_its_checked_execution_settings():
    """A Config's batch_models was checked when the Config was made: ``executor_for`` hands it on;
    ``make_executor`` (no Config) checks its own argument; an executor is given a checked value."""
    config = Config(batch_models="3")
    assert executor_for(config).batch_models == 3 and isinstance(executor_for(config), LocalExecutor)
    pool = executor_for(config, "local", workers=2, cpus_per_trial=1)
    assert isinstance(pool, ProcessExecutor) and pool.batch_models == 3 and pool.threads == 1
    pool.close()
    with pytest.raises(UserError, match="batch_models 3 applies to the local executors"):
        executor_for(config, "ray")
    with pytest.raises(UserError, match="unknown executor 'dask'"):
        executor_for(config, "dask")
    assert make_executor(batch_models=" 4 ").batch_models == 4 and make_executor(batch_models=False).batch_models == "off"
    with pytest.raises(UserError, match="batch_models must be auto, off or a whole number"):
        make_executor(batch_models="x")
    with pytest.raises(AssertionError):
        LocalExecutor(batch_models="4")  # not a checked setting


def test_missing_ray_is_a_one_line_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(UserError, match=r'pip install -e "\.\[distributed\]"'):
        make_executor("ray")
    assert main(["search", "--preset", "quick", "--executor", "ray", "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_parallel_executors_refuse_data_the_config_does_not_name():
    config = Config(**TINY)
    loaders = LoaderData([(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long))],
                         [(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long))],
                         vocab_size=16, seq_len=16)
    with pytest.raises(UserError, match="name the dataset in the config"):
        provide_task(config.task, loaders)
        next(ProcessExecutor(2).run([EvalTask(Trial.from_config("dot|softmax|none|fixed", config, seed=0, steps=2))]))


# -- same results everywhere -----------------------------------------------------------------------
def test_worker_processes_give_the_local_results(tmp_path, reference):
    executor = Watch(make_executor("local", workers=2))
    assert _search(tmp_path / "w2", executor) == reference["full"]
    assert executor.started == executor.stepped == executor.finished == {"w0", "w1"}
    with RunStore.open(tmp_path / "w2", readonly=True) as store:
        assert store.get_meta("executor") == {"name": "process", "workers": 2, "threads_per_worker": 1,
                                              "batch_models": "auto"}
        assert store.activity() == []  # every worker's row is gone once it is done


def test_ray_runs_a_search_end_to_end_with_the_local_results(tmp_path, reference, ray_cluster):
    executor = Watch(RayExecutor(cpus_per_trial=1))
    assert _search(tmp_path / "ray", executor) == reference["full"]
    assert executor.started == executor.finished and all(w.startswith("ray:") for w in executor.finished)
    assert ray_cluster.is_initialized()  # an instance the executor did not start is left running


def test_resume_under_other_executors(tmp_path, reference, ray_cluster):
    config = Config(**TINY)
    out = tmp_path / "cut"
    with Evolution(config, out_dir=out, executor=Watch(LocalExecutor(), 4)) as evo:
        with pytest.raises(KeyboardInterrupt):
            evo.run()
    with Evolution(config, out_dir=out, resume=True, executor=Watch(ProcessExecutor(2), 3)) as evo:
        with pytest.raises(KeyboardInterrupt):
            evo.run()
    with RunStore.open(out, readonly=True) as store:
        assert len(store.evaluations()) == 7
    with Evolution(config, out_dir=out, resume=True, executor=RayExecutor()) as evo:
        evo.run()
    assert _final(out) == reference["full"]

    # halving: checkpoints written by worker processes are continued by Ray tasks
    halving = Config(**{**TINY, "fidelity": "halving", "train_steps": 18})
    out = tmp_path / "halving"
    with Evolution(halving, out_dir=out, executor=Watch(ProcessExecutor(2), 6)) as evo:
        with pytest.raises(KeyboardInterrupt):
            evo.run()
    with Evolution(halving, out_dir=out, resume=True, executor=RayExecutor()) as evo:
        evo.run()
    assert _final(out) == reference["halving"]
    with RunStore.open(out, readonly=True) as store:
        resumed = [r for r in store.evaluations() if r.get("resumed_from")]
    assert resumed and all(r["resumed_from"] < r["steps"] for r in resumed)


class Seen:
    """A progress view noting the workers whose trainings it is shown starting and the answers it is shown."""

    def __init__(self):
        self.started, self.cached = [], []

    def start(self, label, gene, total, worker=None):
        self.started.append(worker)

    def step(self, *args, **kwargs):
        pass

    def finished(self, label, gene, record, cached, done, worker=None):
        self.cached.append(cached)


def test_a_resume_under_workers_trains_the_batches_of_the_uninterrupted_run(tmp_path, one_thread):
    """Workers halve a call's batch so that none idles; an interruption that cut a batch leaves fewer
    trials, which alone would be grouped otherwise (here: a batch of 2 and one alone). The resume plans
    over the call as it began, so the cut batch trains whole again (its stored member too, neither
    shown nor stored) and every record is the uninterrupted run's, bit for bit: this gene's batched
    training depends in its last digits on its partners."""
    config = Config(**{**TINY, "precision": "fp32"})
    data = data_from_config(config)
    tasks = [EvalTask(Trial.from_config("dot|softmax|none|adaptive|bias|0.10|rank=4", config.replace(seed=seed),
                                        data=data)) for seed in range(4)]
    assert [len(group) for group in plan_batches(tasks, 4, workers=2)] == [2, 2]

    def stop(task, record, cached):  # the first record is stored, its partner's is lost
        raise KeyboardInterrupt

    with ProcessExecutor(2, threads=1, batch_models=4) as executor:
        full = Runner(executor, store=RunStore.create(tmp_path / "full", config.to_dict()),
                      data={config.task: data}).evaluate(tasks)
        store = RunStore.create(tmp_path / "cut", config.to_dict())
        with pytest.raises(KeyboardInterrupt):
            Runner(executor, store=store, on_finished=stop).evaluate(tasks)
        assert len(store.evaluations()) == 1
        view = Seen()
        resumed = Runner(executor, store=store, view=view).evaluate(tasks)
    assert all(resumed[t].val_loss == full[t].val_loss and resumed[t].curve == full[t].curve for t in tasks)
    assert len(store.evaluations()) == 4 and all(resumed[t].extra["batched"] == 2 for t in tasks)
    assert sorted(view.cached) == [False, False, False, True] and len(view.started) == 3  # the stored one: once
    store.close()


# -- dead workers ----------------------------------------------------------------------------------
def test_a_killed_worker_is_replaced_and_its_task_retried_once(one_thread):
    import os
    import signal

    config = Config(**TINY)
    data = data_from_config(config)
    genes = ["dot|softmax|none|fixed|bias|0.00", "cosine|softmax|output_gate|learned|bias|0.00",
             "dot|relu_norm|none|fixed|bias|0.00"]
    kills = {genes[0]: 1, genes[1]: 2}  # SIGKILL the worker that starts this gene, this many times
    tasks = [EvalTask(Trial.from_config(g, config, data=data)) for g in genes]
    with ProcessExecutor(2) as executor:
        def on_start(task):
            if kills.get(task.gene, 0) > 0:
                kills[task.gene] -= 1
                os.kill(executor.worker_pids()[task.worker], signal.SIGKILL)

        results = {task.gene: (task, record) for task, record in executor.run(tasks, on_start=on_start)}
    assert set(results) == set(genes) and kills == {genes[0]: 0, genes[1]: 0}
    first = results[genes[0]][1]
    assert first["status"] == "ok"
    local = dict(LocalExecutor().run(tasks[:1]))
    assert first["val_loss"] == next(iter(local.values()))["val_loss"]  # the retry is the same training
    twice = results[genes[1]][1]
    assert twice["status"] == "error" and "died 2 times" in twice["error"] and "SIGKILL" in twice["error"]
    assert results[genes[2]][1]["status"] == "ok"
    assert results[genes[1]][0] == tasks[1]  # tasks come back as submitted (worker id aside)


def test_progress_lines_name_the_worker_and_the_rung(capsys, monkeypatch):
    from evo_attention.util import progress

    monkeypatch.setattr(progress, "is_interactive", lambda: False)
    with progress.SearchView(3, enabled=True) as view:
        view.start("gen 0", "dot|softmax|none|fixed", 400, worker="w1")
        view.step(50, 400, 2.5, worker="w1")
        view.finished("gen 0 rung 1/3", "dot|softmax|none|fixed",
                      {"status": "ok", "val_perplexity": 3.5, "steps": 50, "budget": 400}, False, 1, worker="w1")
        view.finished("gen 0", "dot|softmax|none|fixed", {"status": "ok", "val_perplexity": 3.0}, True, 2)
    lines = capsys.readouterr().err.splitlines()
    assert "gen 0 rung 1/3 dot|softmax|none|fixed ppl 3.500 at 50/400 steps [w1]" in lines[0]
    assert lines[1].endswith("gen 0 dot|softmax|none|fixed ppl 3.000 (cached)")


def test_live_view_has_a_line_per_worker(monkeypatch):
    import io
    import re

    from rich.console import Console

    from evo_attention.util import progress

    out = io.StringIO()
    monkeypatch.setattr(progress, "is_interactive", lambda: True)
    monkeypatch.setattr(progress, "console", Console(file=out, force_terminal=True, width=160))
    with progress.SearchView(4, enabled=True) as view:
        for worker, gene in (("w0", "dot|softmax|none|fixed"), ("w1", "cosine|sparsemax|none|fixed")):
            view.start("gen 1", gene, 400, worker=worker)
            view.step(150, 400, 2.25, worker=worker)
        assert set(view._workers) == {"w0", "w1"}
        view._progress.refresh()
        screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "[w0] gen 1 dot|softmax|none|fixed" in screen and "[w1] gen 1 cosine|sparsemax|none|fixed" in screen
    assert "150/400" in screen


def test_an_unreachable_ray_cluster_is_tried_once_and_refused_in_one_line(monkeypatch):
    pytest.importorskip("ray")
    import os
    from types import SimpleNamespace

    GCS_TRIES = "RAY_gcs_server_port_wait_time_s"  # read by each ray.init
    tries = []

    def init(**kwargs):
        tries.append(os.environ.get(GCS_TRIES))
        raise ConnectionError("Failed to connect to Ray cluster at 127.0.0.1:1")

    monkeypatch.delenv(GCS_TRIES, raising=False)
    executor = RayExecutor(address="127.0.0.1:1")
    executor.ray = SimpleNamespace(is_initialized=lambda: False, init=init)
    with pytest.raises(UserError, match="cannot start or reach the Ray cluster at 127.0.0.1:1"):
        executor._open()
    assert tries == ["1"] and GCS_TRIES not in os.environ  # one try (Ray's default is 20), for this call only


def test_an_executor_subclass_may_bring_its_own_metaclass():
    """Executor is a plain class (no ABCMeta): a plugin executor may mix in a class with a metaclass of its own."""
    from evo_attention.search.executors.base import Executor

    class Registered(type):
        pass

    class Plugin(metaclass=Registered):
        pass

    class PluginExecutor(Executor, Plugin):
        def run(self, tasks, on_result=None):
            return []

    with PluginExecutor() as executor:
        assert isinstance(executor, PluginExecutor)
