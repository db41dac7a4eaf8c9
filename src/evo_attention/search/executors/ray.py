"""Ray: every evaluation a Ray remote task with a resource request, on a local Ray instance or an
existing cluster (``address``). See docs/scaling.md."""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
import warnings
from contextlib import suppress
from dataclasses import replace

import torch

from evo_attention.search.executors.base import (EvalTask, Executor, as_task, available_cores, check_rebuildable,
                                                 execute, failure_record, load_state, store_model, store_state)
from evo_attention.train.spec import load_task
from evo_attention.util.errors import UserError
from evo_attention.util.threads import environment_defaults

GCS_TRIES = "RAY_gcs_server_port_wait_time_s"  # how often ray.init tries a cluster's GCS (read by each call)

class _ProgressSink:
    """A Ray actor collecting progress messages of the remote tasks for the driver."""

    def __init__(self):
        self.items = []

    def put(self, item) -> None:
        self.items.append(item)

    def drain(self) -> list:
        items, self.items = self.items, []
        return items


def _ray_evaluate(token, task, state, device, threads, sink):
    """The body of a Ray remote task: one evaluation."""
    torch.set_num_threads(threads)
    worker = f"ray:{socket.gethostname()}:{os.getpid()}"
    data = load_task(task.trial.task)  # its plugins first; checked against the driver's fingerprint
    sink.put.remote((token, worker, "start"))
    progress = lambda s, n, loss: sink.put.remote((token, worker, "step", s, n, loss))  # noqa: E731
    record, blob, model = execute(task, data, device=device, progress=progress, state=state)
    return record, blob, model, worker


def local_gpus() -> int:
    """The GPUs this process can use (what a local Ray instance offers its tasks)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class RayExecutor(Executor):
    """Evaluations as Ray remote tasks (see the module docstring and docs/scaling.md)."""

    name = "ray"
    batch_models = "off"  # every trial is a Ray task of its own

    def __init__(self, address: str | None = None, *, workers: int | None = None, cpus_per_trial: float = 1.0,
                 gpus_per_trial: float = 0.0, max_retries: int = 1):
        try:
            import ray
        except ImportError:
            raise UserError('the ray executor needs Ray, which is not installed: install it with pip install -e '
                            '".[distributed]"') from None
        self.ray = ray
        for name, value in (("cpus_per_trial", cpus_per_trial), ("gpus_per_trial", gpus_per_trial)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or \
                    (name == "cpus_per_trial" and value <= 0):
                raise UserError(f"{name} must be a {'positive' if name == 'cpus_per_trial' else 'non-negative'} "
                                f"number, got {value!r}", setting=name)
        self.address = address
        self.workers = workers  # a local instance holds workers x cpus_per_trial CPUs (None: every core)
        self.num_cpus = None if workers is None else max(1, math.ceil(workers * cpus_per_trial))
        self.cpus_per_trial = float(cpus_per_trial)
        self.gpus_per_trial = float(gpus_per_trial)
        if address is None:  # a local instance: what it will hold is known now, before Ray starts
            self._check_resources({"CPU": float(self.num_cpus or available_cores()), "GPU": float(local_gpus())},
                                  "this machine")
        self.max_retries = max_retries
        self._owner = False
        self._remote = None
        self._sink = None
        self._tokens = 0

    def describe(self) -> dict:
        return {"name": self.name, "address": self.address, "workers": self.workers,
                "cpus_per_trial": self.cpus_per_trial, "gpus_per_trial": self.gpus_per_trial}

    def training_threads(self) -> int | None:
        return max(1, int(self.cpus_per_trial))  # what each task sets (``_ray_evaluate``)

    def _open(self) -> None:
        if self._remote is not None:
            return
        ray = self.ray
        if not ray.is_initialized():
            # ``ray.init`` installs a native SIGTERM handler that prints a C stack dump and aborts, so a terminated
            # search would never print its resume command: the Python one (main thread only) is put back after it
            main = threading.current_thread() is threading.main_thread()
            handler = signal.getsignal(signal.SIGTERM) if main else None
            try:
                # Ray's own INFO/WARNING lines (its start, its token setup) are not the tool's: only errors show
                logging.getLogger("ray").setLevel(logging.ERROR)
                quiet = dict(log_to_driver=False, logging_level=logging.ERROR)
                if self.address:  # one try to reach its GCS (about 40 s where nothing answers), not Ray's 20
                    with environment_defaults({GCS_TRIES: "1"}):
                        ray.init(address=self.address, **quiet)
                else:
                    ray.init(num_cpus=self.num_cpus, include_dashboard=False, **quiet)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
                raise UserError(f"cannot start or reach {where} ({str(exc).splitlines()[0][:200]}): start a cluster "
                                "with `ray start --head` and pass its address, or leave the address unset", setting="address") from None
            finally:
                if handler is not None:
                    with suppress(ValueError, TypeError, OSError):
                        signal.signal(signal.SIGTERM, handler)
            self._owner = True
            if self.address:  # a cluster: ask it (an unmet request would wait forever)
                self._check_resources(ray.cluster_resources(), f"the Ray cluster at {self.address}")
        self._remote = ray.remote(_ray_evaluate)
        self._sink = ray.remote(num_cpus=0)(_ProgressSink).remote()

    def _check_resources(self, resources, where: str) -> None:
        """Refuse a per-trial request that ``resources`` can never meet: Ray would wait for it forever;
        say in one line when GPUs are there and the trials ask for none (they train on CPUs)."""
        gpus = float(resources.get("GPU", 0.0) or 0.0)
        if gpus and not self.gpus_per_trial:
            warnings.warn(f"{where} has {gpus:g} GPU{'s' if gpus != 1 else ''} and gpus_per_trial is 0: every trial "
                          "trains on CPUs; set gpus_per_trial (e.g. 1, or 0.25 to share a GPU among 4 trials) to "
                          "train on them")
        for kind, wanted, setting in (("GPU", self.gpus_per_trial, "gpus_per_trial"),
                                      ("CPU", self.cpus_per_trial, "cpus_per_trial")):
            have = float(resources.get(kind, 0.0) or 0.0)
            if wanted > have:
                what = "no GPU" if kind == "GPU" and have == 0 else f"{have:g} {kind}{'s' if have != 1 else ''}"
                fix = ("set it to 0 (CPU training) or run on a machine or cluster with GPUs" if kind == "GPU"
                       else "lower it, or give a local instance more (workers) or use a bigger cluster")
                raise UserError(f"{setting} {wanted:g} cannot be met: {where} has {what}, so Ray would wait for "
                                f"it forever; {fix}", setting=setting)

    def _device(self, task: EvalTask) -> str:
        if self.gpus_per_trial > 0:
            return "cuda"  # Ray makes the reserved GPU(s) the visible ones
        device = task.trial.train.device
        return "cpu" if device == "auto" else device

    def run(self, tasks, *, on_start=None, on_step=None):  # every task alone: no batch to plan (no ``answered``)
        tasks = [as_task(task) for task in tasks]
        check_rebuildable(tasks)
        if not tasks:
            return
        self._open()
        ray = self.ray
        options = {"num_cpus": self.cpus_per_trial, "num_gpus": self.gpus_per_trial, "max_retries": self.max_retries}
        threads = max(1, int(self.cpus_per_trial))
        pending: dict = {}
        started: dict[int, EvalTask] = {}
        for task in tasks:
            self._tokens += 1
            ref = self._remote.options(**options).remote(self._tokens, task, load_state(task), self._device(task),
                                                         threads, self._sink)
            pending[ref] = (self._tokens, task)
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                self._progress(pending, started, on_start, on_step)
                for ref in done:
                    token, task = pending.pop(ref)
                    try:
                        record, blob, model, worker = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:
                        cause = getattr(exc, "cause", None)
                        if isinstance(cause, UserError):
                            raise UserError(str(cause)) from None
                        yield task, failure_record(task, f"ray task failed: {str(cause or exc).splitlines()[0][:300]}")
                        continue
                    except ray.exceptions.RayError as exc:  # the worker died (also after the retry)
                        yield task, failure_record(task,
                                                   f"ray worker died running this evaluation ({type(exc).__name__}; "
                                                   f"tried {1 + self.max_retries} times)")
                        continue
                    task = replace(task, worker=worker)
                    if token not in started and on_start is not None:
                        on_start(task)
                    started.pop(token, None)
                    store_state(task, blob)
                    store_model(task, model)
                    yield task, record
        finally:
            for ref in pending:  # abandoned (interrupted): cancel what is left
                with suppress(Exception):  # best effort
                    ray.cancel(ref, force=True)

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
            with suppress(Exception):  # best effort
                self.ray.kill(self._sink)
        if self._owner and self.ray.is_initialized():
            self.ray.shutdown()
        self._owner = False
        self._remote = self._sink = None
