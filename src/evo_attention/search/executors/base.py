"""Executors: where evaluations run (docs/scaling.md). The runner hands over tasks and gets records back.

An executor receives ``EvalTask`` s and yields ``(task, record)`` pairs as they finish, in any order;
the runner stores each record at once. Executors never touch the store and never decide anything
about the search: ``LocalExecutor`` (``local``, the default) trains in this process, one task at a
time; ``ProcessExecutor`` (``process.py``) keeps ``workers`` processes on this machine;
``RayExecutor`` (``ray.py``) runs every task as a Ray remote task, locally or on a cluster.

Workers rebuild each trial's dataset from its task spec (``load_task``) and check its fingerprint;
the driver's data is never sent. Every evaluation is seeded by its task alone, so the results do not
depend on the executor, the number of workers or the order of completion. The callbacks
``on_start(task)`` and ``on_step(task, step, total, loss)`` get the task with its ``worker`` set
(``"local"``, ``"w0"``, ``"ray:host:pid"``; the i-th task of a batch ``"local#i"``); ``worker``
takes no part in comparisons, so the yielded task equals the submitted one.

Batches (``batch_models``: auto, off or K; the local executors): the tasks of one call whose trials
can train as one batched model (``train.trainer.shape_difference``) are planned into groups of at
most K (``plan_batches``), each group of two or more trained by ``run_batched``: each trial gets its
own record (``batched: K``) and callbacks, and the result it gets trained alone (bitwise, or within
``trainer.SAME_RESULT_RTOL``). Tasks that need what a batch cannot give train alone (``alone_reason``).

A multi-fidelity task may continue from a checkpoint (``resume_from``) and leave one (``save_to``);
a task with ``keep_model`` gets the trained model's files. Both travel between worker and driver as
bytes, read and written on the driver's side, so workers need no shared file system; a checkpoint
is verified before use, and one that fails the check is treated as missing (``load_state``).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from contextlib import suppress
from dataclasses import dataclass, field, replace
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import Callable, Collection, Iterator, Sequence

import torch

from evo_attention.data.base import TaskData
from evo_attention.genes import layers_of
from evo_attention.train.batching import models_per_batch
from evo_attention.train.probe_cache import pin_probes
from evo_attention.train.record import EvaluationRecord, failed_record
from evo_attention.train.spec import Trial, load_task
from evo_attention.train.trainer import batch_problem, run_batched, run_training, shape_difference
from evo_attention.train.environment import resolve_compile, resolve_device, versions
from evo_attention.util.errors import UserError
from evo_attention.util.files import write_bytes, write_directory
from evo_attention.util.threads import cores as available_cores  # noqa: F401 - the cores this process may use

StartFn = Callable[["EvalTask"], None]
StepFn = Callable[["EvalTask", int, int, float], None]


@dataclass(frozen=True)
class EvalTask:
    """A trial to run, and what the run does around it: the role and generation its record is
    stored with, a label for progress lines, the checkpoint files of a partial training and where a
    kept model goes. Two tasks are the same work when their trials are equal."""

    trial: Trial
    role: str = "search"
    generation: int | None = None
    label: str = ""
    resume_from: str | None = None  # a checkpoint file to continue from (missing: from scratch)
    save_to: str | None = None  # where to write the trainer state after training
    audit: bool = False  # multi-fidelity: trained to the full budget whatever its early loss
    keep_model: str | None = field(default=None, compare=False)  # a directory for the trained model
    probes: dict | None = field(default=None, compare=False)  # the run's pinned probe answers (train.probe_cache)
    worker: str = field(default="", compare=False)  # set by the executor: who runs it

    # the trial's identity, as the progress lines and the store speak of it
    gene = property(attrgetter("trial.genome"))
    seed = property(attrgetter("trial.seed"))
    steps = property(attrgetter("trial.steps"))
    budget = property(attrgetter("trial.budget"))


def as_task(work: "EvalTask | Trial") -> EvalTask:
    """A trial given bare runs as a task of role ``search`` with no bookkeeping."""
    return work if isinstance(work, EvalTask) else EvalTask(work)


# -- what every executor shares --------------------------------------------------------------------
def execute(task: EvalTask, data: TaskData, *, device=None, progress=None,
            state: bytes | None = None) -> tuple[EvaluationRecord, bytes | None, dict | None]:
    """Run one task where the caller is, on ``data`` (its trial's dataset): ``(record, trainer
    state bytes or None, model files or None)``. The model files (``train.saving.model_files``:
    name -> bytes) come back when the task asks to keep its model and trained successfully to its
    full budget."""
    if task.probes is not None:
        pin_probes(task.probes)
    result = run_training(task.trial, data, device=device, progress=progress, state=state,
                          keep_state=task.save_to is not None)
    model = None
    if task.keep_model and result.trainer is not None and result.record.ok and task.steps == task.trial.schedule_steps:
        from evo_attention.train.saving import model_files

        record = result.record
        model = model_files(result.trainer.model, tokenizer=getattr(data, "tokenizer", None), vocab=data.vocab,
                            settings=result.trainer.settings,
                            extra={"evaluation": {name: record.get(name) for name in KEPT_FIELDS}})
    return result.record, result.state, model


def execute_batch(tasks: Sequence[EvalTask], data: TaskData, *, device=None,
                  progress: Sequence | None = None) -> list[EvaluationRecord]:
    """Run the tasks of one planned batch (``plan_batches``) as one batched model where the caller
    is, on ``data`` (their trials' dataset): one record per task, in order. ``progress``: one
    ``(step, total, loss)`` callback (or None) per task."""
    if tasks and tasks[0].probes is not None:
        pin_probes(tasks[0].probes)
    results = run_batched([task.trial for task in tasks], data, device=device, progress=progress)
    return [result.record for result in results]


def execute_group(tasks: Sequence[EvalTask], data: TaskData, *, device=None, report=None,
                  state: bytes | None = None) -> tuple[list[EvaluationRecord], bytes | None, dict | None]:
    """Run one planned group (``plan_batches``) where the caller is: ``(records, trainer state, model
    files)``, by ``execute`` for a task alone, by ``execute_batch`` for several (no state, no model).
    ``report(i, step, total, loss)`` (or None) hears of the i-th task's progress."""
    progress = [None if report is None else partial(report, i) for i in range(len(tasks))]
    if len(tasks) > 1:
        return execute_batch(tasks, data, device=device, progress=progress), None, None
    record, state, model = execute(tasks[0], data, device=device, progress=progress[0], state=state)
    return [record], state, model


# -- planning batches ----------------------------------------------------------------------------------
def alone_reason(task: EvalTask) -> str | None:
    """Why ``task`` trains alone whatever ``batch_models`` says (None: it may join a batch)."""
    if task.resume_from is not None or task.save_to is not None:
        return "it continues from or leaves a checkpoint"
    if task.keep_model is not None:
        return "its trained model is kept"
    if task.audit:
        return "it is audited"
    return batch_problem(task.trial)


def _same_batch(first: EvalTask, task: EvalTask) -> bool:
    a, b = first.trial, task.trial
    return (a.train.device == b.train.device and a.train.compile == b.train.compile
            and shape_difference([a, b]) is None)


def _compiles(task: EvalTask) -> bool:
    """Whether the task's single trainer would compile its model (a batch runs eager)."""
    trial = task.trial
    return trial.train.compile != "off" and resolve_compile(trial.train.compile, resolve_device(trial.train.device),
                                                            layers_of(trial.gene), trial.schedule_steps)


def _split(tasks: list, k: int) -> list[list]:
    """``tasks`` in ceil(n / k) consecutive groups of sizes differing by at most one."""
    groups = -(-len(tasks) // k)
    size, extra = divmod(len(tasks), groups)  # the first ``extra`` groups take one more
    return [tasks[i * size + min(i, extra):(i + 1) * size + min(i + 1, extra)] for i in range(groups)]


def plan_batches(tasks: Sequence[EvalTask], batch_models: str | int, *, workers: int = 1,
                 memory_share: int = 1) -> list[list[EvalTask]]:
    """The tasks in groups, in the order they were given (a group where its first task stands): a
    group of several trains as one batch, a group of one alone, exactly as without batching.

    Tasks whose trials can share a batch (``batch_models`` other than off and 1; same device and
    compile setting; ``alone_reason`` None) are gathered, and each gathering of n is split evenly
    into ceil(n / K) groups, K being ``batch_models`` or, for auto, ``batching.models_per_batch``
    for their shape (measured once per machine and shape; ``memory_share``: how many trainings
    share this machine's memory). Then, while there are fewer groups than ``workers``, the largest
    group is halved: a batch never leaves a worker idle.
    """
    tasks = list(tasks)
    if batch_models in ("off", 1):
        return [[task] for task in tasks]
    gatherings: list[list[EvalTask]] = []
    plan: list[list[EvalTask]] = []  # singles and gatherings (filled in place), in order of their first task
    for task in tasks:
        if alone_reason(task) is not None:
            plan.append([task])
            continue
        gathering = next((g for g in gatherings if _same_batch(g[0], task)), None)
        if gathering is None:
            gathering = []
            gatherings.append(gathering)
            plan.append(gathering)
        gathering.append(task)
    groups: list[list[EvalTask]] = []
    for entry in plan:
        k = 1
        if len(entry) > 1 and not _compiles(entry[0]):
            first = entry[0].trial
            k = (batch_models if isinstance(batch_models, int)
                 else models_per_batch(batch_models, first, load_task(first.task), share=memory_share)[0])
        groups.extend(_split(entry, k) if k > 1 else [[task] for task in entry])
    while len(groups) < workers:
        largest = max(range(len(groups)), key=lambda i: len(groups[i]), default=None)
        if largest is None or len(groups[largest]) < 2:
            break
        group = groups[largest]
        half = (len(group) + 1) // 2
        groups[largest:largest + 1] = [group[:half], group[half:]]
    return groups


def planned(tasks: Sequence[EvalTask], batch_models: str | int, answered: Collection = (), *, on_start=None,
            on_step=None, **plan) -> tuple[list[list[EvalTask]], set, StartFn | None, StepFn | None]:
    """An executor's groups of one call (``Executor.run``): ``plan_batches`` over all its tasks, less the
    groups whose every task is ``answered``; with the answered tasks, and the callbacks silent for them
    (a group trains them again only so that it is the group it was, and they are reported by nobody)."""
    answered = set(answered)
    groups = [group for group in plan_batches(tasks, batch_models, **plan) if not answered.issuperset(group)]
    hush = lambda fn: fn and (lambda task, *args: None if task in answered else fn(task, *args))  # noqa: E731
    return groups, answered, hush(on_start), hush(on_step)


def named(group: Sequence[EvalTask], worker: str) -> list[EvalTask]:
    """The tasks of a planned group as ``worker`` runs them: a task alone as ``worker``, the i-th of a
    batch (from 1) as ``worker#i``."""
    if len(group) == 1:
        return [replace(group[0], worker=worker)]
    return [replace(task, worker=f"{worker}#{i}") for i, task in enumerate(group, 1)]


# what a kept model's config.json says of the evaluation that trained it
KEPT_FIELDS = ("gene", "seed", "steps", "data", "data_fingerprint", "context", "eval_split", "val_loss",
               "val_perplexity", "accuracy", "bits_per_byte", "params", "versions")


def store_model(task: EvalTask, files: dict | None) -> None:
    """Write a task's trained model into ``task.keep_model`` (the driver side: atomically, as a whole)."""
    if task.keep_model is not None and files is not None:
        write_directory(task.keep_model, files)


def failure_record(task: EvalTask, message: str) -> EvaluationRecord:
    """The record of a task that could not run to the end (e.g. its worker kept dying)."""
    trial = task.trial
    data = load_task(trial.task)
    return failed_record(trial.genome, trial.seed, trial.steps, data.name, data.fingerprint, trial.context,
                         error=message, eval_split=trial.eval_split, versions=versions(),
                         settings=trial.record_settings(), budget=trial.budget,
                         resumed_from=0 if trial.budget is not None else None)


# A rung state file: one header line (the magic, then JSON: the payload's size and sha256 and the
# identity of the partial training that left it), then the trainer state's bytes, all of it checked
# (``load_state``) before a single byte reaches torch.
STATE_MAGIC = b"evo-attention-state 1 "


def verified_state(trial: Trial, blob: bytes) -> tuple[bytes | None, str]:
    """``(payload, "")`` if ``blob`` is an intact state that a continuation of ``trial`` may start
    from, else ``(None, why not)``."""
    if not blob.startswith(STATE_MAGIC):
        return None, "it has no evo-attention state header (damaged, or written by an older version)"
    line, newline, payload = blob[len(STATE_MAGIC):].partition(b"\n")
    try:
        header = json.loads(line) if newline else None
    except ValueError:
        header = None
    if not isinstance(header, dict):
        return None, "its header is damaged"
    if header.get("size") != len(payload) or header.get("sha256") != hashlib.sha256(payload).hexdigest():
        return None, f"its checksum does not match ({len(payload):,} of {header.get('size')} bytes): damaged or truncated"
    steps = header.get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or not 0 < steps < trial.steps:
        return None, f"it holds step {steps!r}, not a step below {trial.steps}"
    left_by = trial.replace(steps=steps)
    if any(header.get(k) != getattr(left_by, k) for k in ("genome", "seed", "budget", "context")):
        return None, "it belongs to another training (gene, seed, budget or settings differ)"
    return payload, ""


def load_state(task: EvalTask) -> bytes | None:
    """The checkpoint ``task`` continues from, verified (None: train from scratch). A file that fails
    the check is named in a warning, removed, and treated as missing: the task trains from scratch,
    which gives the same result, and nothing of it reaches the gene's record."""
    if not task.resume_from or not os.path.isfile(task.resume_from):
        return None
    path = Path(task.resume_from)
    try:
        blob = path.read_bytes()
    except OSError as exc:
        payload, why = None, f"it cannot be read ({exc.strerror or type(exc).__name__})"
    else:
        payload, why = verified_state(task.trial, blob)
    if payload is None:
        warnings.warn(f"rung state {path.name} is not usable ({why}): training {task.gene} (seed {task.seed}) "
                      f"from scratch to {task.steps} steps instead, which gives the same result")
        with suppress(OSError):
            path.unlink()
    return payload


def store_state(task: EvalTask, state: bytes | None) -> None:
    """Write a task's checkpoint with its header (atomically: a reader never sees half a file)."""
    if task.save_to is not None and state is not None:
        trial = task.trial
        header = {"size": len(state), "sha256": hashlib.sha256(state).hexdigest(), "genome": trial.genome,
                  "seed": trial.seed, "steps": trial.steps, "budget": trial.budget, "context": trial.context}
        write_bytes(task.save_to, STATE_MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + state)


def check_rebuildable(tasks: Sequence[EvalTask]) -> None:
    """Parallel workers build each trial's data from its task spec: refuse data the spec does not name."""
    from evo_attention.data import DATASET_FACTORIES

    for spec in dict.fromkeys(task.trial.task for task in tasks):
        data = load_task(spec)
        if data.name != spec.data and spec.data not in DATASET_FACTORIES:  # a plugin dataset is rebuilt by name
            raise UserError(
                f"parallel executors rebuild the dataset from the config in every worker, but this search trains on "
                f"{data.name!r} data that the config does not name (config data {spec.data!r}): name the dataset in "
                "the config (data, data_dir) or use the local executor")


def worker_devices(device: str, n: int) -> list[str]:
    """Devices of ``n`` workers: round-robin over the visible GPUs when ``device`` is auto or cuda,
    else ``device`` for all."""
    if device in ("auto", "cuda"):
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return [f"cuda:{i % torch.cuda.device_count()}" for i in range(n)]
    return [device] * n


def valid_batch_models(value: str | int) -> str | int:
    """``value`` as given, asserted to be a ``batch_models`` setting as a Config keeps it (auto, off or
    K >= 1). The check of what a user wrote is the Config's (or ``make_executor``'s:
    ``train.config.batch_models_value``); an executor receives its result."""
    assert value in ("auto", "off") or (type(value) is int and value >= 1), \
        f"batch_models {value!r} is not a checked setting: take a Config's or make_executor's"
    return value


class Executor:
    """Runs evaluation tasks (each a trial, with its bookkeeping); subclasses may run them in
    parallel. The trials of one call may differ in any field: genome, seed, recipe, model, task.
    Each trial's dataset is ``load_task(trial.task)``: data a caller built itself is made known to
    the process first (``provide_task``; the runner does it)."""

    name = "base"
    workers = 1
    batch_models: str | int = "auto"  # how many same-shape trials train as one batch (plan_batches)

    def run(self, tasks: Sequence["EvalTask | Trial"], *, on_start: StartFn | None = None,
            on_step: StepFn | None = None, answered: Collection = ()) -> Iterator[tuple[EvalTask, EvaluationRecord]]:
        """Train ``tasks`` and yield ``(task, record)`` for each that is not ``answered``: those of
        ``tasks`` whose records the caller has (an interrupted earlier session of this very call trained
        them), planned with the others so that every batch is the one the whole call had (``planned``).
        A ``run`` without the ``answered`` keyword is handed the tasks still to train alone."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name, "workers": self.workers}

    def training_threads(self) -> int | None:
        """The CPU threads each training runs with (None: not known here). Sums over another number
        of threads add in another order, so a CPU result can differ in its last digits."""
        return None

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class LocalExecutor(Executor):
    """In-process, one evaluation (or one planned batch) at a time (the default)."""

    name = "local"

    def __init__(self, *, batch_models: str | int = "auto"):
        self.batch_models = valid_batch_models(batch_models)

    def describe(self) -> dict:
        return {**super().describe(), "batch_models": self.batch_models}

    def training_threads(self) -> int | None:
        return torch.get_num_threads()

    def run(self, tasks, *, on_start=None, on_step=None, answered=()):
        groups, answered, on_start, on_step = planned([as_task(task) for task in tasks], self.batch_models, answered,
                                                      on_start=on_start, on_step=on_step)
        for group in groups:
            members = named(group, "local")
            for task in members if on_start is not None else ():
                on_start(task)
            report = None if on_step is None else (lambda i, s, n, loss, m=members: on_step(m[i], s, n, loss))
            records, state, model = execute_group(members, load_task(members[0].trial.task), report=report,
                                                  state=load_state(members[0]))  # a batch leaves no state, no model
            store_state(members[0], state)
            store_model(members[0], model)
            yield from ((task, record) for task, record in zip(members, records) if task not in answered)


