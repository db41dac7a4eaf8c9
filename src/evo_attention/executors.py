"""Executors: where evaluations run. The driver hands over tasks and gets records back.

An executor receives a list of ``EvalTask`` s (gene, seed, steps, split) and yields
``(task, record)`` pairs as they finish, in any order; the driver writes each record into the run
store at once, so an interruption loses at most the evaluations in flight. Executors never
touch the store themselves and never decide anything about the search.

- ``LocalExecutor`` (``local``, the default) trains in this process, one task at a time.
- ``ProcessExecutor`` (``--workers N``) keeps N worker processes (spawned, never forked) on this
  machine, each pinned to a device (round-robin over the visible GPUs; on a CPU the cores are
  split evenly between them: ``cores // N`` threads each). A worker that dies (a signal, the
  OOM killer) is replaced and its task retried once; a second death gives an ``error`` record.
  Each worker talks to the driver over a pipe of its own (tasks one way; progress and results the
  other), so a worker killed in the middle of a message cannot break the others' channel.
- ``RayExecutor`` (``--executor ray``) runs every task as a Ray remote task with a resource
  request, on a local Ray instance or on an existing cluster (``--ray-address``).

Workers rebuild the dataset from the config (``data.data_from_config``; the tokenization cache makes
that cheap) and check its fingerprint against the driver's; the driver's in-memory data is never
sent. Every evaluation is seeded by its task alone (the run seed: common random numbers), so the
results do not depend on the executor, the number of workers or the order of completion.

Callbacks: ``on_start(task)`` and ``on_step(task, step, total, loss)`` get the task with its
``worker`` field set (``"local"``, ``"w0"``, ``"w1"``, ``"ray:host:pid"``); ``worker`` does not take
part in comparisons, so the yielded task equals the submitted one.

Multi-fidelity tasks (``budget`` set, see ``fidelity.py``) may continue from a checkpoint
(``resume_from``) and leave one (``save_to``). Checkpoint files are read and written by the driver
side of the executor and travel to the worker as bytes, so workers need no shared file system.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import deque
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .config import Config
from .data.base import TaskData
from .errors import UserError

StartFn = Callable[["EvalTask"], None]
StepFn = Callable[["EvalTask", int, int, float], None]

# Test hook: "<gene key>=<times>@<directory>" (several joined by ";") makes a worker process kill
# itself when it starts that gene, as long as fewer than <times> marker files are in <directory>
# (one is added per kill).
CRASH_ENV = "EVO_ATTENTION_TEST_CRASH"
# Settings that determine the dataset a worker rebuilds.
DATA_FIELDS = ("data", "data_dir", "vocab_size", "max_seq_len", "eval_stride", "recall")
EXECUTORS = ("local", "process", "ray")
RAY_EXTRA_HINT = 'install it with pip install -e ".[distributed]"'
START_TIMEOUT_S = 300.0  # a worker imports torch and evo_attention before it is ready


@dataclass(frozen=True)
class EvalTask:
    gene: str  # gene key
    seed: int
    steps: int
    eval_split: str = "valid"
    role: str = "search"
    generation: int | None = None
    label: str = ""
    budget: int | None = None  # multi-fidelity: train steps 0..steps of a budget-step schedule
    resume_from: str | None = None  # a checkpoint file to continue from (missing: from scratch)
    save_to: str | None = None  # where to write the trainer state after training
    audit: bool = False  # multi-fidelity: trained to the full budget whatever its early loss
    worker: str = field(default="", compare=False)  # set by the executor: who runs it


# -- what every executor shares --------------------------------------------------------------------
def task_context(task: EvalTask, config: Config) -> str:
    """The cache-key context of the record ``task`` produces."""
    from .fidelity import evaluation_context

    return evaluation_context(config, task.eval_split, task.steps, task.budget)


def execute(task: EvalTask, config: Config, data: TaskData, *, device=None, progress=None,
            state: bytes | None = None) -> tuple[dict, bytes | None]:
    """Run one task where the caller is: ``(record, trainer state bytes or None)``."""
    if task.budget is None:
        from .training import train_and_evaluate

        record = train_and_evaluate(task.gene, config, data, seed=task.seed, steps=task.steps,
                                    eval_split=task.eval_split, device=device, progress=progress)
        return record, None
    from .fidelity import train_rung

    return train_rung(task.gene, config, data, seed=task.seed, steps=task.steps, budget=task.budget, state=state,
                      save_state=task.save_to is not None, eval_split=task.eval_split, device=device,
                      progress=progress)


def failure_record(task: EvalTask, config: Config, data: TaskData, message: str) -> dict:
    """The record of a task that could not run to the end (e.g. its worker kept dying)."""
    from .training import CONTEXT_FIELDS, failed_metrics, versions

    record = {
        "gene": task.gene, "seed": task.seed, "steps": task.steps, "data": data.name,
        "data_fingerprint": data.fingerprint, "context": task_context(task, config), "device": None,
        "versions": versions(), "settings": {name: getattr(config, name) for name in CONTEXT_FIELDS},
        "status": "error", "error": message, **failed_metrics(), "train_loss": math.nan, "trained_steps": 0,
        "curve": [], "flops_per_step": None, "time_s": None, "params": None, "precision": None,
    }
    if task.budget is not None:
        record.update(budget=task.budget, resumed_from=0)
    return record


def load_state(task: EvalTask) -> bytes | None:
    """The checkpoint ``task`` continues from (None: train from scratch)."""
    if task.resume_from and os.path.isfile(task.resume_from):
        return Path(task.resume_from).read_bytes()
    return None


def store_state(task: EvalTask, state: bytes | None) -> None:
    """Write a task's checkpoint (atomically: a reader never sees half a file)."""
    if task.save_to is None or state is None:
        return
    path = Path(task.save_to)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(state)
    os.replace(partial, path)


def check_rebuildable(config: Config, data: TaskData) -> None:
    """Parallel workers rebuild the data from the config: refuse data the config does not name."""
    if data.name != config.data:
        raise UserError(
            f"parallel executors rebuild the dataset from the config in every worker, but this search trains on "
            f"{data.name!r} data that the config does not name (config data {config.data!r}): name the dataset in "
            "the config (data, data_dir) or use the local executor")


_DATA_CACHE: dict[str, TaskData] = {}


def rebuild_data(config: Config, fingerprint: str) -> TaskData:
    """The dataset ``config`` names, built once per worker process, checked against the driver's."""
    key = json.dumps({name: getattr(config, name) for name in DATA_FIELDS}, sort_keys=True, default=str)
    data = _DATA_CACHE.get(key)
    if data is None:
        from .data import data_from_config

        data = data_from_config(config)
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = data
    if data.fingerprint != fingerprint:
        raise UserError(
            f"the dataset a worker rebuilt from the config differs from the driver's (fingerprint "
            f"{data.fingerprint[:12]} vs {fingerprint[:12]}): point data_dir at the data the search uses, or use "
            "the local executor")
    return data


def _test_crash_hook(task: EvalTask) -> None:
    for spec in filter(None, os.environ.get(CRASH_ENV, "").split(";")):
        gene, _, rest = spec.rpartition("=")
        times, _, directory = rest.partition("@")
        if gene != task.gene:
            continue
        marks = Path(directory)
        marks.mkdir(parents=True, exist_ok=True)
        n = len(list(marks.glob("crash-*")))
        if n < int(times):
            (marks / f"crash-{n}-{os.getpid()}").touch()
            import signal

            os.kill(os.getpid(), signal.SIGKILL)


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def worker_devices(device: str, n: int) -> list[str]:
    """Devices of ``n`` workers: round-robin over the visible GPUs when ``device`` is auto or cuda,
    else ``device`` for all."""
    if device in ("auto", "cuda"):
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return [f"cuda:{i % torch.cuda.device_count()}" for i in range(n)]
    return [device] * n


class Executor:
    """Runs evaluation tasks; subclasses may run them in parallel."""

    name = "base"
    workers = 1

    def run(self, tasks: Sequence[EvalTask], config: Config, data: TaskData, *,
            on_start: StartFn | None = None, on_step: StepFn | None = None) -> Iterator[tuple[EvalTask, dict]]:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name, "workers": self.workers}

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class LocalExecutor(Executor):
    """In-process, one evaluation at a time (the default)."""

    name = "local"

    def run(self, tasks, config, data, *, on_start=None, on_step=None):
        for task in tasks:
            task = replace(task, worker="local")
            if on_start is not None:
                on_start(task)
            progress = None if on_step is None else (lambda s, n, loss, t=task: on_step(t, s, n, loss))
            record, state = execute(task, config, data, progress=progress, state=load_state(task))
            store_state(task, state)
            yield task, record


# -- worker processes on this machine ---------------------------------------------------------------
def _die_with_parent() -> None:
    """Linux: have the kernel kill this worker when the driver dies (even by SIGKILL)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_main(worker: str, threads: int, conn) -> None:
    """A worker process: take tasks from ``conn``, send progress and results back."""
    _die_with_parent()
    import torch

    torch.set_num_threads(threads)
    try:
        conn.send(("ready", None))
    except (BrokenPipeError, EOFError, OSError):
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if message is None:
            return
        token, task, config_dict, fingerprint, device, state = message
        try:
            _test_crash_hook(task)
            config = Config.from_dict(config_dict)
            data = rebuild_data(config, fingerprint)
            progress = lambda s, n, loss: conn.send(("step", token, s, n, loss))  # noqa: E731
            record, blob = execute(task, config, data, device=device, progress=progress, state=state)
            conn.send(("done", token, record, blob))
        except KeyboardInterrupt:
            return
        except UserError as exc:
            conn.send(("fatal", token, str(exc)))
        except (BrokenPipeError, EOFError):
            return
        except Exception as exc:  # infrastructure trouble: the task fails, the worker goes on
            conn.send(("error", token, f"{type(exc).__name__}: {exc}".splitlines()[0][:500]))


class _Slot:
    """One worker: its process, its pipe and the task it is running (``job``)."""

    def __init__(self, context, index: int, threads: int):
        self.index = index
        self.id = f"w{index}"
        self.context = context
        self.threads = threads
        self.process = None
        self.conn = None
        self.job = None  # (token, task with worker set, attempts)

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self) -> None:
        """Start the worker and wait until it is ready."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        parent, child = self.context.Pipe(duplex=True)
        self.process = self.context.Process(target=_worker_main, args=(self.id, self.threads, child),
                                            name=f"evo-attention-{self.id}", daemon=True)
        self.process.start()
        child.close()
        self.conn = parent
        self.job = None

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Wait for the worker's "ready" (a worker that cannot start is an error of the setup, not
        of an evaluation: UserError)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.conn.poll(0.2):
                    if self.conn.recv()[0] == "ready":
                        return
                    continue
            except (EOFError, OSError):
                break
            if not self.process.is_alive():
                break
        self.process.join(1.0)
        how = "did not report ready in time" if self.process.is_alive() else _describe_exit(self.process.exitcode)
        self.stop(kill=True)
        raise UserError(f"worker process {self.id} could not start ({how}): a script that runs a search with "
                        "worker processes must guard its entry point with `if __name__ == \"__main__\":` "
                        "(workers are spawned and import it)")

    def stop(self, kill: bool = False, timeout: float = 5.0) -> None:
        if self.process is None:
            return
        if not kill and self.conn is not None:
            try:
                self.conn.send(None)
            except (OSError, ValueError):
                pass
            self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)
        if self.conn is not None:
            self.conn.close()
        self.process = self.conn = self.job = None


def _describe_exit(code) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = "; out of memory?" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exit code {code}"


class ProcessExecutor(Executor):
    """``workers`` processes on this machine (see the module docstring)."""

    name = "process"

    def __init__(self, workers: int = 2, *, threads: int | None = None, max_attempts: int = 2):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise UserError(f"--workers must be a positive integer, got {workers!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise UserError(f"threads per worker must be a positive integer, got {threads!r}")
        import multiprocessing

        self.workers = workers
        self.threads = threads or max(1, available_cores() // workers)
        self.max_attempts = max_attempts
        self._context = multiprocessing.get_context("spawn")
        self._slots = [_Slot(self._context, i, self.threads) for i in range(workers)]
        self._parent_threads: int | None = None
        self._tokens = 0

    def describe(self) -> dict:
        return {"name": self.name, "workers": self.workers, "threads_per_worker": self.threads}

    def _open(self) -> None:
        if self._parent_threads is None:
            import torch

            self._parent_threads = torch.get_num_threads()
            torch.set_num_threads(self.threads)  # the driver's share of the cores
        starting = [slot for slot in self._slots if not slot.alive()]
        for slot in starting:  # start them together, then wait for each
            slot.stop(kill=True)
            slot.launch()
        try:
            for slot in starting:
                slot.wait_ready()
        except UserError:
            for slot in self._slots:
                slot.stop(kill=True)
            raise

    def run(self, tasks, config, data, *, on_start=None, on_step=None):
        check_rebuildable(config, data)
        if not tasks:
            return
        self._open()
        devices = worker_devices(config.device, self.workers)
        config_dict, fingerprint = config.to_dict(), data.fingerprint
        queue = deque((task, 0) for task in tasks)
        try:
            while queue or any(slot.job for slot in self._slots):
                for slot in self._slots:  # hand out work
                    while slot.job is None and queue:
                        task, attempts = queue.popleft()
                        self._tokens += 1
                        job = (self._tokens, replace(task, worker=slot.id), attempts)
                        try:
                            slot.conn.send((job[0], task, config_dict, fingerprint, devices[slot.index],
                                            load_state(task)))
                        except (OSError, ValueError):  # died while idle: replace it, try again
                            queue.appendleft((task, attempts))
                            slot.stop(kill=True)
                            slot.start()
                            continue
                        slot.job = job
                        if on_start is not None:
                            on_start(job[1])
                busy = [slot for slot in self._slots if slot.job is not None]
                ready = set(wait([s.conn for s in busy] + [s.process.sentinel for s in busy], timeout=1.0))
                for slot in busy:
                    if slot.conn in ready or slot.process.sentinel in ready:
                        yield from self._serve(slot, queue, config, data, on_step)
        finally:
            for slot in self._slots:  # abandoned (interrupted): stop the work in flight
                if slot.job is not None:
                    slot.stop(kill=True)

    def _serve(self, slot: _Slot, queue: deque, config, data, on_step):
        """Read what ``slot`` sent; handle its death."""
        token, task, attempts = slot.job
        while slot.job is not None:
            try:
                if not slot.conn.poll():
                    break
                message = slot.conn.recv()
            except (EOFError, OSError):
                break
            if message[1] != token:
                continue  # a late message of an abandoned task
            kind = message[0]
            if kind == "step":
                if on_step is not None:
                    on_step(task, *message[2:5])
            elif kind == "done":
                store_state(task, message[3])
                slot.job = None
                yield task, message[2]
            elif kind == "error":
                slot.job = None
                yield task, failure_record(task, config, data, message[2])
            elif kind == "fatal":
                slot.job = None
                raise UserError(message[2])
        if slot.job is not None and not slot.process.is_alive():
            slot.process.join()
            how = _describe_exit(slot.process.exitcode)
            slot.stop(kill=True)
            slot.start()  # a fresh worker takes the dead one's place
            if attempts + 1 < self.max_attempts:
                queue.appendleft((replace(task, worker=""), attempts + 1))
            else:
                yield task, failure_record(task, config, data, f"the worker process died {attempts + 1} times "
                                                               f"running this evaluation (last: {how})")

    def close(self) -> None:
        for slot in self._slots:
            if slot.process is not None and slot.job is None:
                try:
                    slot.conn.send(None)  # idle workers: ask all to exit first, then wait for each
                except (OSError, ValueError):
                    pass
        for slot in self._slots:
            slot.stop(kill=slot.job is not None)  # a worker still busy (interrupted run) is killed
        if self._parent_threads is not None:
            import torch

            torch.set_num_threads(self._parent_threads)
            self._parent_threads = None


# -- Ray --------------------------------------------------------------------------------------------
class _ProgressSink:
    """A Ray actor collecting progress messages of the remote tasks for the driver."""

    def __init__(self):
        self.items = []

    def put(self, item) -> None:
        self.items.append(item)

    def drain(self) -> list:
        items, self.items = self.items, []
        return items


def _ray_evaluate(token, task, config_dict, fingerprint, state, device, threads, sink):
    """The body of a Ray remote task: one evaluation."""
    import socket

    import torch

    torch.set_num_threads(threads)
    worker = f"ray:{socket.gethostname()}:{os.getpid()}"
    _test_crash_hook(task)
    config = Config.from_dict(config_dict)
    data = rebuild_data(config, fingerprint)
    sink.put.remote((token, worker, "start"))
    progress = lambda s, n, loss: sink.put.remote((token, worker, "step", s, n, loss))  # noqa: E731
    record, blob = execute(task, config, data, device=device, progress=progress, state=state)
    return record, blob, worker


def import_ray():
    try:
        import ray
    except ImportError:
        raise UserError(f"the ray executor needs Ray, which is not installed: {RAY_EXTRA_HINT}") from None
    return ray


class RayExecutor(Executor):
    """Evaluations as Ray remote tasks (see the module docstring and docs/scaling.md)."""

    name = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None, cpus_per_trial: float = 1.0,
                 gpus_per_trial: float = 0.0, max_retries: int = 1):
        self.ray = import_ray()
        for flag, value, low in (("--cpus-per-trial", cpus_per_trial, 0.0), ("--gpus-per-trial", gpus_per_trial, 0.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or \
                    (flag == "--cpus-per-trial" and value <= 0):
                raise UserError(f"{flag} must be a {'positive' if flag == '--cpus-per-trial' else 'non-negative'} "
                                f"number, got {value!r}")
        self.address = address
        self.num_cpus = num_cpus
        self.cpus_per_trial = float(cpus_per_trial)
        self.gpus_per_trial = float(gpus_per_trial)
        self.max_retries = max_retries
        self.workers = None
        self._owner = False
        self._remote = None
        self._sink = None
        self._tokens = 0

    def describe(self) -> dict:
        return {"name": self.name, "address": self.address, "cpus_per_trial": self.cpus_per_trial,
                "gpus_per_trial": self.gpus_per_trial}

    def _open(self) -> None:
        if self._remote is not None:
            return
        ray = self.ray
        if not ray.is_initialized():
            try:
                if self.address:
                    ray.init(address=self.address, log_to_driver=False)
                else:
                    ray.init(num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
                raise UserError(f"cannot start or reach {where} ({str(exc).splitlines()[0][:200]}): start a cluster "
                                "with `ray start --head` and pass its address, or drop --ray-address") from None
            self._owner = True
        self._remote = ray.remote(_ray_evaluate)
        self._sink = ray.remote(num_cpus=0)(_ProgressSink).remote()

    def _device(self, config: Config) -> str:
        if self.gpus_per_trial > 0:
            return "cuda"  # Ray makes the reserved GPU(s) the visible ones
        return "cpu" if config.device == "auto" else config.device

    def run(self, tasks, config, data, *, on_start=None, on_step=None):
        check_rebuildable(config, data)
        if not tasks:
            return
        self._open()
        ray = self.ray
        options = {"num_cpus": self.cpus_per_trial, "num_gpus": self.gpus_per_trial, "max_retries": self.max_retries}
        threads = max(1, int(self.cpus_per_trial))
        config_dict, device = config.to_dict(), self._device(config)
        pending: dict = {}
        started: dict[int, EvalTask] = {}
        for task in tasks:
            self._tokens += 1
            ref = self._remote.options(**options).remote(self._tokens, task, config_dict, data.fingerprint,
                                                         load_state(task), device, threads, self._sink)
            pending[ref] = (self._tokens, task)
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                self._progress(pending, started, on_start, on_step)
                for ref in done:
                    token, task = pending.pop(ref)
                    try:
                        record, blob, worker = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:
                        cause = getattr(exc, "cause", None)
                        if isinstance(cause, UserError):
                            raise UserError(str(cause)) from None
                        yield task, failure_record(task, config, data, f"ray task failed: {str(cause or exc).splitlines()[0][:300]}")
                        continue
                    except ray.exceptions.RayError as exc:  # the worker died (also after the retry)
                        yield task, failure_record(task, config, data,
                                                   f"ray worker died running this evaluation ({type(exc).__name__}; "
                                                   f"tried {1 + self.max_retries} times)")
                        continue
                    task = replace(task, worker=worker)
                    if token not in started and on_start is not None:
                        on_start(task)
                    started.pop(token, None)
                    store_state(task, blob)
                    yield task, record
        finally:
            for ref in pending:  # abandoned (interrupted): cancel what is left
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 - best effort
                    pass

    def _progress(self, pending, started, on_start, on_step) -> None:
        tasks = {token: task for token, task in pending.values()}
        for token, worker, kind, *rest in self.ray.get(self._sink.drain.remote()):
            if token not in tasks:
                continue
            task = replace(tasks[token], worker=worker)
            if token not in started:
                started[token] = task
                if on_start is not None:
                    on_start(task)
            if kind == "step" and on_step is not None:
                on_step(task, *rest)

    def close(self) -> None:
        if self._sink is not None:
            try:
                self.ray.kill(self._sink)
            except Exception:  # noqa: BLE001 - best effort
                pass
        if self._owner and self.ray.is_initialized():
            self.ray.shutdown()
        self._owner = False
        self._remote = self._sink = None


# -- choosing ---------------------------------------------------------------------------------------
def make_executor(name: str = "local", *, workers: int | None = None, address: str | None = None,
                  cpus_per_trial: float | None = None, gpus_per_trial: float | None = None) -> Executor:
    """The executor ``name`` with its options (the CLI's ``--executor``, ``--workers``, ...).

    ``local`` with ``workers`` is a ``ProcessExecutor`` (``cpus_per_trial``: threads per worker,
    default an even share of the cores); ``ray`` with ``workers`` sizes a local Ray instance to
    ``workers x cpus_per_trial`` CPUs.
    """
    if name not in EXECUTORS:
        raise UserError(f"unknown executor {name!r}: valid executors are {', '.join(EXECUTORS)}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise UserError(f"--workers must be a positive integer, got {workers!r}")
    if name == "ray":
        cpus = 1.0 if cpus_per_trial is None else cpus_per_trial
        if workers is not None and address is not None:
            raise UserError("--workers sizes a local Ray instance; a Ray cluster (--ray-address) runs as many "
                            "evaluations at once as its resources allow: drop --workers")
        num_cpus = None if workers is None else max(1, math.ceil(workers * cpus))
        return RayExecutor(address, num_cpus=num_cpus, cpus_per_trial=cpus,
                           gpus_per_trial=0.0 if gpus_per_trial is None else gpus_per_trial)
    if address is not None:
        raise UserError("--ray-address needs --executor ray")
    if gpus_per_trial is not None:
        raise UserError("--gpus-per-trial applies to --executor ray; --workers N puts each worker on a GPU of its own "
                        "(round-robin over the visible GPUs)")
    threads = None
    if cpus_per_trial is not None:
        if isinstance(cpus_per_trial, bool) or float(cpus_per_trial) != int(cpus_per_trial) or cpus_per_trial < 1:
            raise UserError(f"--cpus-per-trial with --workers is the number of threads per worker: a whole number "
                            f">= 1, got {cpus_per_trial!r}")
        threads = int(cpus_per_trial)
    if name == "local" and workers is None:
        if threads is not None:
            raise UserError("--cpus-per-trial needs --workers N (or --executor ray)")
        return LocalExecutor()
    return ProcessExecutor(workers or 2, threads=threads)
