"""The runner: cached, progress-reporting evaluation of a batch of tasks, for every part of the
product that trains models (the search driver and the studies). A ``Runner``

1. answers each task from the run store when a record of the same ``trial.key()`` is stored: a cache
   hit is never trained again; the trials of one call may differ in any field;
2. gives the others to the executor and stores each record the moment it comes back, so an
   interruption loses at most the trainings in flight; a call an interruption cut is batched again as
   it began (``_plan``): a batch the cut split trains whole again, its answered members neither
   stored nor reported again;
3. reports progress (``util.progress.SearchView``) and the workers' activity in the store.

With ``equivalence=True`` (program searches) a trial that misses is also answered by a stored record
of the same functional key (``search.equivalence``), copied under its own key with ``equivalent_to``
(``equivalent_answers`` counts them), unless it was still to train when an interrupted earlier
session of the same call began. Without a store nothing is cached or kept. The run's probe answers
(``train.probe_cache``, meta ``PROBES``) are pinned here and handed to every worker with its tasks,
so a resume, and every worker, decide precision and models per batch as the run began.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from inspect import signature
from pathlib import Path
from typing import Callable, Sequence

from evo_attention.genes import gene_label
from evo_attention.search.equivalence import functional_key
from evo_attention.search.executors import EvalTask, Executor, as_task
from evo_attention.search.store import RunStore
from evo_attention.train.probe_cache import pin_probes, pinned_probes, used_probes
from evo_attention.train.record import EvaluationRecord
from evo_attention.train.spec import Trial, load_task, provide_task
from evo_attention.util.progress import SearchView

PROBES = "probes"  # meta: the probe answers (precision per shape, models per batch) the run pinned at first use
PLAN = "plan"  # meta (after ``activity``): the call begun last, and which of its tasks were still to train then

FinishedFn = Callable[[EvalTask, EvaluationRecord, bool], None]  # (task, record, served from the store)


class Runner:
    """Evaluate tasks through ``executor``, cached in ``store``.

    ``data`` maps task specs to datasets the caller built itself (a search's data, a dataset object
    the config cannot rebuild); every other trial's data is built from its task (``load_task``).
    A trial without a data fingerprint gets its dataset's. ``view`` is the progress display
    (``SearchView``); ``activity`` prefixes the worker names this runner writes into the store's
    activity table (so a study running beside a search clears only its own rows); ``on_finished``
    is called for every task answered, cached or trained.
    """

    def __init__(self, executor: Executor, *, store: RunStore | None = None, data: dict | None = None,
                 view: SearchView | None = None, activity: str = "", on_finished: FinishedFn | None = None,
                 equivalence: bool = False):
        self.executor = executor
        for task, dataset in (data or {}).items():
            provide_task(task, dataset)
        self.store, self.view = store, view
        if store is not None:  # the probe answers the run pinned decide its trainings here and in every worker
            pin_probes(store.get_meta(PROBES) or {})
        self.activity = activity
        self.on_finished = on_finished
        self.done = 0
        self.equivalence = equivalence and store is not None
        self.equivalent_answers = 0
        self._functional: dict | None = None  # functional key -> a stored record (built on first use)

    def lookup(self, task: "EvalTask | Trial") -> EvaluationRecord | None:
        """The stored record of ``task``'s trial, or None."""
        return None if self.store is None else self.store.lookup(*resolved(as_task(task)).trial.key())

    def evaluate(self, tasks: Sequence["EvalTask | Trial"]) -> dict:
        """The record of every task, by the task as given (a task repeated in ``tasks`` is evaluated
        once)."""
        resolved_tasks = {work: resolved(as_task(work)) for work in dict.fromkeys(tasks)}
        records = self._evaluate(list(dict.fromkeys(resolved_tasks.values())))
        return {work: records[task] for work, task in resolved_tasks.items()}

    def _evaluate(self, tasks: list) -> dict[EvalTask, EvaluationRecord]:
        records: dict[EvalTask, EvaluationRecord] = {}
        call, began = self._began(tasks)
        todo = []
        for i, task in enumerate(tasks):
            hit = self.lookup(task)
            if hit is None and self.equivalence and i not in began:  # to train when the call began: it trains
                hit = self._equivalent(task)
            if hit is not None:
                records[task] = hit
                self.announce(task, hit, cached=True)
            else:
                todo.append(task)
        plan = self._plan(tasks, todo, call, began)
        if self.store is not None:
            plan = [replace(task, probes=pinned_probes()) for task in plan]
        answered = {"answered": [task for task in plan if task in records]} if len(plan) > len(todo) else {}
        try:
            for task, record in self.executor.run(plan, on_start=self._start, on_step=self._step, **answered):
                record = self._annotate(task, record)
                if self.store is not None:
                    self._pin(record)
                    self.store.record(record, role=task.role, generation=task.generation)
                    self.store.clear_activity(self._worker(task))
                    self._remember(record)
                records[task] = record
                self.announce(task, record, cached=False)
        finally:
            self._clear_activity()
        return records

    def _began(self, tasks: list) -> tuple[str | None, set]:
        """This call's identity (a hash of its trial keys), and which of its tasks were still to train when an
        earlier session of this very call began (meta PLAN), which an interruption cut; none for a new call."""
        if self.store is None:
            return None, set()
        call = hashlib.sha256(json.dumps([task.trial.key() for task in tasks]).encode()).hexdigest()
        began = self.store.get_meta(self.activity + PLAN) or {}
        return call, set(began.get("pending", ())) if began.get("call") == call else set()

    def _plan(self, tasks: list, todo: list, call: str | None, began: set) -> list:
        """The tasks the executor plans this call's batches over (in the caller's order): those to train,
        and those that were when an earlier session of this very call began (``began``), which an
        interruption cut: the batches are the uninterrupted run's, and so are their records. Which were
        to train is kept for a later session (meta PLAN)."""
        if call is None or not todo:
            return todo
        pending = set(todo)
        held = [i for i, task in enumerate(tasks) if i in began or task in pending]
        self.store.set_meta(self.activity + PLAN, {"call": call, "pending": held})
        if "answered" not in signature(self.executor.run).parameters:
            return todo
        return [tasks[i] for i in held]

    # -- functional equivalence ------------------------------------------------------------------------
    def _equivalent(self, task: EvalTask) -> EvaluationRecord | None:
        """A stored record of a functionally equivalent trial, stored again under ``task``'s key."""
        key = resolved(task).trial.key()
        wanted = functional_key(*key)
        if wanted is None:
            return None
        if self._functional is None:
            self._functional = {}
            for record in self.store.evaluations():
                self._remember(record)
        twin = self._functional.get(wanted)
        if twin is None:
            return None
        copy = twin.replace(gene=getattr(key[0], "key", key[0]), extra={**twin.extra, "equivalent_to": twin.gene})
        self.store.record(copy, role=task.role, generation=task.generation)
        self.equivalent_answers += 1
        return self.store.lookup(*key)

    def _remember(self, record: EvaluationRecord) -> None:
        if self._functional is None or record.status != "ok" or "prog=" not in str(record.gene):
            return
        key = functional_key(record.gene, record.seed, record.steps, record.data_fingerprint, record.context)
        self._functional.setdefault(key, record)

    # -- internals ---------------------------------------------------------------------------------
    def _annotate(self, task: EvalTask, record: EvaluationRecord) -> EvaluationRecord:
        """The multi-fidelity facts only the task knows: the checkpoint it left, whether it is audited."""
        changes = {}
        if task.save_to is not None and record.status == "ok" and Path(task.save_to).is_file() and self.store:
            changes["checkpoint"] = Path(task.save_to).relative_to(self.store.run_dir).as_posix()
        if task.audit:
            changes["audit"] = True
        return record.replace(**changes) if changes else record

    def _pin(self, record: EvaluationRecord) -> None:
        """Pin the probe answers first used for ``record`` (a worker's, or this process's batch
        plan): the first answer of a probe file stays the run's (meta PROBES)."""
        pinned = self.store.get_meta(PROBES) or {}
        new = {name: entry for name, entry in {**used_probes(), **(record.extra.get("probes") or {})}.items()
               if name not in pinned}
        if new:
            pinned.update(new)
            self.store.set_meta(PROBES, pinned)
        pin_probes(pinned)

    def _worker(self, task: EvalTask) -> str:
        return f"{self.activity}{task.worker or self.executor.name}"

    def _start(self, task: EvalTask) -> None:
        total = task.budget or task.steps
        if self.view is not None:
            self.view.start(task.label, gene_label(task.gene), total, worker=task.worker or None)
        if self.store is not None:
            self.store.set_activity(self._worker(task), task.gene, 0, total, None)

    def _step(self, task: EvalTask, step: int, total: int, loss: float) -> None:
        if self.view is not None:
            self.view.step(step, total, loss, worker=task.worker or None)
        if self.store is not None:
            self.store.set_activity(self._worker(task), task.gene, step, total, loss)

    def announce(self, task: EvalTask, record: EvaluationRecord, cached: bool) -> None:
        """Count ``task`` as answered and report it (also for a record the caller found itself)."""
        self.done += 1
        if self.on_finished is not None:
            self.on_finished(task, record, cached)
        if self.view is not None:
            self.view.finished(task.label, gene_label(task.gene), record, cached, self.done, worker=task.worker or None)

    def _clear_activity(self) -> None:
        if self.store is None:
            return
        if not self.activity:
            self.store.clear_activity()
            return
        for row in self.store.activity():  # only its own rows: a search may be running beside it
            if str(row["worker"]).startswith(self.activity):
                self.store.clear_activity(row["worker"])


def resolved(task: EvalTask) -> EvalTask:
    """``task`` with its trial's data fingerprint filled in (from its dataset, built once)."""
    if task.trial.task.fingerprint is not None:
        return task
    return replace(task, trial=task.trial.with_data(load_task(task.trial.task)))
