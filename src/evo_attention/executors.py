"""Executors: where evaluations run. The driver hands over tasks and gets records back.

An executor receives a list of ``EvalTask`` s (gene, seed, steps, split) and yields
``(task, record)`` pairs as they finish, in any order; the driver writes each record into the run
store at once, so an interruption loses at most the evaluations in flight. Executors never
touch the store themselves and never decide anything about the search.

``LocalExecutor`` trains in this process, one task at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from .config import Config
from .data.base import TaskData

StartFn = Callable[["EvalTask"], None]
StepFn = Callable[["EvalTask", int, int, float], None]


@dataclass(frozen=True)
class EvalTask:
    gene: str  # gene key
    seed: int
    steps: int
    eval_split: str = "valid"
    role: str = "search"
    generation: int | None = None
    label: str = ""


class Executor:
    """Runs evaluation tasks; subclasses may run them in parallel."""

    name = "base"
    workers = 1

    def run(self, tasks: Sequence[EvalTask], config: Config, data: TaskData, *,
            on_start: StartFn | None = None, on_step: StepFn | None = None) -> Iterator[tuple[EvalTask, dict]]:
        raise NotImplementedError

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
        from .training import train_and_evaluate

        for task in tasks:
            if on_start is not None:
                on_start(task)
            progress = None if on_step is None else (lambda s, n, loss, t=task: on_step(t, s, n, loss))
            record = train_and_evaluate(task.gene, config, data, seed=task.seed, steps=task.steps,
                                        eval_split=task.eval_split, progress=progress)
            yield task, record


def make_executor(name: str = "local", **options) -> Executor:
    from .errors import UserError

    if name == "local":
        return LocalExecutor()
    raise UserError(f"unknown executor {name!r}: valid executors are local")
