"""Worker processes on this machine (``workers`` N; docs/scaling.md).

N spawned (never forked) workers, each pinned to a device (round-robin over the visible GPUs; on a
CPU ``cores // N`` threads each) and talking to the driver over a pipe of its own, so a worker killed
mid-message cannot break the others' channel. A worker that dies is replaced and its job retried
once; a second death gives an ``error`` record. The driver plans the batches of a call over all its
tasks (``plan_batches``, with the number of workers and each worker's share of the memory) and hands
each worker a job: one task or one planned batch. A batch whose worker dies is retried as its tasks
alone, each counting the death as an attempt.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import signal
import time
import warnings
from collections import deque
from contextlib import suppress
from dataclasses import replace
from multiprocessing.connection import wait

import torch

from evo_attention.search.executors.base import (Executor, as_task, available_cores, check_rebuildable, execute_group,
                                                 failure_record, load_state, named, planned, store_model,
                                                 store_state, valid_batch_models, worker_devices)
from evo_attention.train.spec import load_task
from evo_attention.util.errors import UserError
from evo_attention.util.progress import format_warning

START_TIMEOUT_S = 300.0  # a worker imports torch and evo_attention before it is ready


def _die_with_parent() -> None:
    """Linux: have the kernel kill this worker when the driver dies (even by SIGKILL)."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def _worker_main(threads: int, conn) -> None:
    """A worker process: take tasks from ``conn``, send progress and results back."""
    _die_with_parent()
    warnings.formatwarning = format_warning  # one line each, as the driver's
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
        token, tasks, device, state = message  # one task, or the tasks of one planned batch
        try:
            data = load_task(tasks[0].trial.task)  # its plugins first; checked against the driver's fingerprint
            report = lambda i, s, n, loss: conn.send(("step", token, i, s, n, loss))  # noqa: E731
            conn.send(("done", token, *execute_group(tasks, data, device=device, report=report, state=state)))
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
        self.job = None  # (token, [its task, or its batch's tasks, with worker set], attempts)

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        parent, child = self.context.Pipe(duplex=True)
        self.process = self.context.Process(target=_worker_main, args=(self.threads, child),
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
            with suppress(OSError, ValueError):
                self.conn.send(None)
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

    def __init__(self, workers: int = 2, *, threads: int | None = None, max_attempts: int = 2,
                 batch_models: str | int = "auto"):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise UserError(f"workers must be a positive integer, got {workers!r}", setting="workers")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise UserError(f"threads per worker must be a positive integer, got {threads!r}")
        self.workers = workers
        self.threads = threads or max(1, available_cores() // workers)
        self.max_attempts = max_attempts
        self.batch_models = valid_batch_models(batch_models)
        self._context = multiprocessing.get_context("spawn")
        self._slots = [_Slot(self._context, i, self.threads) for i in range(workers)]
        self._parent_threads: int | None = None
        self._tokens = 0

    def describe(self) -> dict:
        return {**super().describe(), "threads_per_worker": self.threads, "batch_models": self.batch_models}

    def training_threads(self) -> int | None:
        return self.threads

    def worker_pids(self) -> dict[str, int]:
        """The process id of every running worker, by worker id (``w0``, ``w1``, ...)."""
        return {slot.id: slot.process.pid for slot in self._slots if slot.alive()}

    def _open(self) -> None:
        if self._parent_threads is None:
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

    def run(self, tasks, *, on_start=None, on_step=None, answered=()):
        tasks = [as_task(task) for task in tasks]
        check_rebuildable(tasks)
        if not tasks:
            return
        self._open()
        devices = worker_devices(tasks[0].trial.train.device, self.workers)
        share = max(devices.count(device) for device in devices)  # the workers that share one device's memory
        groups, answered, on_start, on_step = planned(tasks, self.batch_models, answered, on_start=on_start,
                                                      on_step=on_step, workers=self.workers, memory_share=share)
        queue = deque((group, 0) for group in groups)
        try:
            while queue or any(slot.job for slot in self._slots):
                for slot in self._slots:  # hand out work
                    while slot.job is None and queue:
                        group, attempts = queue.popleft()
                        self._tokens += 1
                        job = (self._tokens, named(group, slot.id), attempts)
                        state = load_state(group[0]) if len(group) == 1 else None
                        try:
                            slot.conn.send((job[0], group, devices[slot.index], state))
                        except (OSError, ValueError):  # died while idle: replace it, try again
                            queue.appendleft((group, attempts))
                            slot.stop(kill=True)
                            slot.start()
                            continue
                        slot.job = job
                        for task in job[1] if on_start is not None else ():
                            on_start(task)
                busy = [slot for slot in self._slots if slot.job is not None]
                ready = set(wait([s.conn for s in busy] + [s.process.sentinel for s in busy], timeout=1.0))
                for slot in busy:
                    if slot.conn in ready or slot.process.sentinel in ready:
                        yield from self._serve(slot, queue, on_step, answered)
        finally:
            for slot in self._slots:  # abandoned (interrupted): stop the work in flight
                if slot.job is not None:
                    slot.stop(kill=True)

    def _serve(self, slot: _Slot, queue: deque, on_step, answered: set):
        """Read what ``slot`` sent; handle its death. Nothing of an ``answered`` task is yielded, nor retried."""
        token, tasks, attempts = slot.job
        pending = [task for task in tasks if task not in answered]
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
                    on_step(tasks[message[2]], *message[3:6])
            elif kind == "done":
                if len(tasks) == 1:
                    store_state(tasks[0], message[3])
                    store_model(tasks[0], message[4])
                slot.job = None
                yield from ((task, record) for task, record in zip(tasks, message[2]) if task not in answered)
            elif kind == "error":
                slot.job = None
                for task in pending:
                    yield task, failure_record(task, message[2])
            elif kind == "fatal":
                slot.job = None
                raise UserError(message[2])
        if slot.job is not None and not slot.process.is_alive():
            slot.process.join()
            how = _describe_exit(slot.process.exitcode)
            slot.stop(kill=True)
            slot.start()  # a fresh worker takes the dead one's place
            if attempts + 1 < self.max_attempts:  # a batch's tasks are retried alone, first in line
                queue.extendleft(([replace(task, worker="")], attempts + 1) for task in reversed(pending))
            else:
                for task in pending:
                    yield task, failure_record(task, f"the worker process died {attempts + 1} times "
                                                     f"running this evaluation (last: {how})")

    def close(self) -> None:
        for slot in self._slots:
            if slot.process is not None and slot.job is None:
                with suppress(OSError, ValueError):
                    slot.conn.send(None)  # idle workers: ask all to exit first, then wait for each
        for slot in self._slots:
            slot.stop(kill=slot.job is not None)  # a worker still busy (interrupted run) is killed
        if self._parent_threads is not None:
            torch.set_num_threads(self._parent_threads)
            self._parent_threads = None
