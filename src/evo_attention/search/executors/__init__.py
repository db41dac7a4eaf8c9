"""Where evaluations run: ``executor_for`` (a Config's) or ``make_executor`` (options alone) picks
one: ``local`` (``LocalExecutor``; with ``workers``, ``ProcessExecutor``) or ``ray``
(``RayExecutor``). ``base`` describes the interface, each executor and batching."""

from __future__ import annotations

from evo_attention.search.executors.base import EvalTask, Executor, LocalExecutor, as_task, available_cores
from evo_attention.search.executors.process import ProcessExecutor
from evo_attention.search.executors.ray import RayExecutor
from evo_attention.train.config import Config, batch_models_value
from evo_attention.util.errors import UserError

EXECUTORS = ("local", "process", "ray")


def make_executor(name: str = "local", *, workers: int | None = None, address: str | None = None,
                  cpus_per_trial: float | None = None, gpus_per_trial: float | None = None,
                  batch_models: str | int = "auto") -> Executor:
    """The executor ``name`` with its options: the library's entry for an executor without a Config.

    ``local`` with ``workers`` is a ``ProcessExecutor`` (``cpus_per_trial``: threads per worker,
    default an even share of the cores); ``ray`` with ``workers`` sizes a local Ray instance to
    ``workers x cpus_per_trial`` CPUs. ``batch_models``: how many same-shape trials the local
    executors train as one batch (auto, off or K; checked here as a Config checks it, the one check
    outside a Config); Ray does not batch, so it takes auto or off (or 1) only. With a Config at
    hand, ``executor_for`` gives the executor its execution settings.
    """
    if name not in EXECUTORS:
        raise UserError(f"unknown executor {name!r}: valid executors are {', '.join(EXECUTORS)}")
    batch_models = batch_models_value(batch_models)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise UserError(f"workers must be a positive integer, got {workers!r}", setting="workers")
    if name == "ray":
        cpus = 1.0 if cpus_per_trial is None else cpus_per_trial
        if workers is not None and address is not None:
            raise UserError("workers sizes a local Ray instance; a Ray cluster (address) runs as many "
                            "evaluations at once as its resources allow: drop workers", setting=("workers", "address"))
        if isinstance(batch_models, int) and batch_models > 1:
            raise UserError(f"batch_models {batch_models} applies to the local executors: Ray trains every trial as "
                            "a task of its own; use batch_models auto or off with executor ray",
                            setting=("batch_models", "executor"))
        return RayExecutor(address, workers=workers, cpus_per_trial=cpus,
                           gpus_per_trial=0.0 if gpus_per_trial is None else gpus_per_trial)
    if address is not None:
        raise UserError("address needs executor ray", setting=("address", "executor"))
    if gpus_per_trial is not None:
        raise UserError("gpus_per_trial applies to executor ray; workers N puts each worker on a GPU of its own "
                        "(round-robin over the visible GPUs)", setting=("gpus_per_trial", "executor", "workers"))
    threads = None
    if cpus_per_trial is not None:
        if isinstance(cpus_per_trial, bool) or float(cpus_per_trial) != int(cpus_per_trial) or cpus_per_trial < 1:
            raise UserError(f"cpus_per_trial with workers is the number of threads per worker: a whole number "
                            f">= 1, got {cpus_per_trial!r}", setting=("cpus_per_trial", "workers"))
        threads = int(cpus_per_trial)
    if name == "local" and workers is None:
        if threads is not None:
            raise UserError("cpus_per_trial needs workers N (or executor ray)", setting=("cpus_per_trial", "workers", "executor"))
        return LocalExecutor(batch_models=batch_models)
    return ProcessExecutor(workers or 2, threads=threads, batch_models=batch_models)


def executor_for(config: Config, name: str = "local", *, workers: int | None = None, address: str | None = None,
                 cpus_per_trial: float | None = None, gpus_per_trial: float | None = None) -> Executor:
    """The executor ``name`` (``make_executor``'s options) running trials as ``config``'s execution
    settings say (``batch_models``, valid since the Config was made): the one place the driver, the
    studies and the command line build an executor for a Config."""
    return make_executor(name, workers=workers, address=address, cpus_per_trial=cpus_per_trial,
                         gpus_per_trial=gpus_per_trial, batch_models=config.batch_models)


__all__ = ["EXECUTORS", "EvalTask", "Executor", "LocalExecutor", "ProcessExecutor", "RayExecutor", "as_task",
           "available_cores", "executor_for", "make_executor"]
