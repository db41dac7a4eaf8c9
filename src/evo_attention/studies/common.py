"""What the seed-based studies share: one setup, one result shape, per-gene samples, and writing a
result as JSON + markdown.

``StudySetup`` is what validate, ablate, transfer and compare repeat, resolved once
(``StudySetup.resolve``): the config and data, the seeds, the steps, the split, the metric with its
confidence level, and where the trainings run and are kept (executor, run store). Its ``train``
runs every (gene, seed) pair as a ``Trial`` through the ``Runner`` (a pair stored already is read
back, never trained again; each new record is stored the moment it finishes), and its
``provenance`` is the settings block every result carries.

``StudyResult`` is what a study returns: typed fields, and the read-only mapping of its
``to_dict()``, which is exactly what the study writes to its JSON file (and what the report reads
back), so ``result.genes`` and ``result["genes"]`` are the same rows.

The seeds of a study are ``seed + 1 ... seed + N``, never the search seed on which a search picked
its winners (a winner's score on that seed is biased low: the winner's curse).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Iterator, Sequence

from evo_attention.genes import AttentionGene
from evo_attention.report.attachments import output_stem
from evo_attention.report.studies import metric_info
from evo_attention.search.executors import EvalTask, Executor, make_executor
from evo_attention.search.runner import Runner
from evo_attention.search.store import RunStore
from evo_attention.train.record import EvaluationRecord, objective_value, usable_metric
from evo_attention.train.spec import Trial
from evo_attention.util import stats
from evo_attention.util.errors import UserError
from evo_attention.util.files import output_dir, write_text
from evo_attention.util.jsonio import dumps, to_jsonable
from evo_attention.util.progress import SearchView

DEFAULT_SEEDS = 5

Records = dict[tuple[str, int], EvaluationRecord]  # (gene key, seed) -> record
FinishedFn = Callable[[EvalTask, EvaluationRecord, bool], None]  # the runner's (task, record, cached)


def validation_seeds(base_seed: int, n: int, search_seed: int | None = None, *, minimum: int = 2,
                     setting: str = "n_seeds") -> list[int]:
    """``base_seed + 1 ... base_seed + n``; refuses fewer than ``minimum`` seeds (a spread and an
    interval need 2) and a list that holds ``search_seed``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        why = ("a spread and a confidence interval need at least 2 seeds (5 is the default)" if minimum >= 2
               else "give a positive number of seeds")
        raise UserError(f"{setting} {n!r} is too few: {why}", setting=setting)
    seeds = list(range(int(base_seed) + 1, int(base_seed) + n + 1))
    if search_seed is not None and search_seed in seeds:
        raise UserError(f"the validation seeds {seeds[0]}..{seeds[-1]} include {search_seed}, on which the search picked "
                        f"its winners: use seed {search_seed} (seeds {search_seed + 1}..) or leave seed unset",
                        setting="seed")
    return seeds


# -- the setup ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StudySetup:
    """What a seed-based study trains with. Build it with ``resolve`` (which checks every setting
    and derives the seeds and steps); a ladder of sizes changes ``config`` and ``steps`` per rung
    (``at``). ``store`` (None: nothing cached or kept) and ``executor`` (None: a local one, made
    and closed per ``train``) are where the trainings are kept and run; the caller owns both."""

    config: Any  # train.Config
    data: Any  # the TaskData the config names (or the caller's own)
    seeds: tuple[int, ...]
    steps: int
    role: str  # the role the records are stored with
    eval_split: str = "valid"
    metric: str = "val_perplexity"
    confidence: float = 0.95
    search_seed: int | None = None
    source_run: str | None = None
    store: RunStore | None = field(default=None, compare=False, repr=False)
    executor: Executor | None = field(default=None, compare=False, repr=False)
    quiet: bool = True

    @classmethod
    def resolve(cls, config, data, *, role: str, n_seeds: int = DEFAULT_SEEDS, min_seeds: int = 2,
                steps: int | None = None, eval_split: str = "valid", metric: str = "val_perplexity",
                confidence: float = 0.95, store: RunStore | None = None, executor: Executor | None = None,
                search_seed: int | None = None, source_run: str | os.PathLike | None = None, quiet: bool = True,
                seeds_setting: str = "n_seeds") -> "StudySetup":
        """The setup of a study: seeds ``config.seed + 1 ... + n_seeds`` (at least ``min_seeds``,
        never ``search_seed``), ``steps`` (default ``config.train_steps``); UserError for a bad
        confidence, metric or seed count (this one named ``seeds_setting``, the caller's name for
        it), before anything is trained."""
        stats.check_confidence(confidence)
        metric_info(metric, eval_split)
        seeds = validation_seeds(config.seed, n_seeds, search_seed, minimum=min_seeds, setting=seeds_setting)
        return cls(config=config, data=data, seeds=tuple(seeds),
                   steps=int(config.train_steps if steps is None else steps), role=role, eval_split=eval_split,
                   metric=metric, confidence=confidence, search_seed=search_seed,
                   source_run=None if source_run is None else str(source_run), store=store, executor=executor,
                   quiet=quiet)

    def at(self, config) -> "StudySetup":
        """This setup with another config (a rung of a ladder), trained for its ``train_steps``."""
        return dataclasses.replace(self, config=config, steps=int(config.train_steps))

    # -- what the metric reads as --------------------------------------------------------------
    @property
    def metric_label(self) -> str:
        return metric_info(self.metric, self.eval_split)[0]

    @property
    def lower_is_better(self) -> bool:
        return metric_info(self.metric, self.eval_split)[1]

    # -- training -------------------------------------------------------------------------------
    def tasks(self, genes: Iterable[AttentionGene | str], labels: Mapping[str, str] | None = None) -> list[EvalTask]:
        """One task per distinct gene and seed (genes in the given order, then seeds); ``labels``
        (gene key -> name) names them in progress lines, else ``seed N``."""
        keys = list(dict.fromkeys(AttentionGene.parse(g).key for g in genes))
        labels = labels or {}
        return [EvalTask(Trial.from_config(key, self.config, seed=seed, steps=self.steps, eval_split=self.eval_split,
                                           data=self.data),
                         role=self.role, label=f"{labels[key]}, seed {seed}" if key in labels else f"seed {seed}")
                for key in keys for seed in self.seeds]

    def train(self, genes: Iterable[AttentionGene | str], *, labels: Mapping[str, str] | None = None,
              on_finished: FinishedFn | None = None) -> Records:
        """The record of every (gene, seed): from the store when there, else trained and stored at
        once. ``on_finished(task, record, cached)`` sees each as it comes (an interrupted study
        keeps what finished through it)."""
        tasks = self.tasks(genes, labels)
        executor = self.executor if self.executor is not None else make_executor("local")
        try:
            with SearchView(len(tasks), enabled=not self.quiet) as view:
                runner = Runner(executor, store=self.store, data={self.config.task: self.data}, view=view,
                                activity=f"{self.role}:", on_finished=on_finished)
                records = runner.evaluate(tasks)
        finally:
            if self.executor is None:
                executor.close()
        return {(task.gene, task.seed): record for task, record in records.items()}

    # -- provenance -----------------------------------------------------------------------------
    def provenance(self, steps: int | Sequence[int] | None = None) -> dict:
        """The settings block every study result carries (enough to reproduce it); ``steps``
        replaces the setup's own (a ladder gives one per rung)."""
        from evo_attention.train.environment import versions

        import matplotlib
        import numpy
        import scipy

        return {
            "metric": self.metric, "metric_label": self.metric_label, "lower_is_better": self.lower_is_better,
            "eval_split": self.eval_split, "confidence": self.confidence, "seeds": list(self.seeds),
            "search_seed": self.search_seed, "steps": self.steps if steps is None else steps,
            "source_run": self.source_run,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "config": self.config.to_dict(), "data": self.data.describe(),
            "versions": {**versions(), "numpy": numpy.__version__, "scipy": scipy.__version__,
                         "matplotlib": matplotlib.__version__},
        }


def run_seeds(genes: Iterable[AttentionGene | str], config, data, seeds: Sequence[int], *, steps: int | None = None,
              eval_split: str = "valid", role: str = "validate", store=None, executor: Executor | None = None,
              quiet: bool = True) -> Records:
    """Records of every (gene, seed) of explicit ``seeds`` (``StudySetup.train`` without the
    checks of a study): from ``store`` when there, else trained by ``executor`` (default: a local
    one) and stored at once. Keys are (gene key, seed)."""
    setup = StudySetup(config=config, data=data, seeds=tuple(int(s) for s in seeds),
                       steps=int(config.train_steps if steps is None else steps), role=role, eval_split=eval_split,
                       store=store, executor=executor, quiet=quiet)
    return setup.train(genes)


def study_store(directory: str | os.PathLike, config, study: str) -> RunStore:
    """The run store that keeps a study's trainings in ``directory``: the one there (a run's, or
    an earlier study's), else a new one holding ``config`` as its configuration."""
    if RunStore.exists(directory):
        return RunStore.open(directory)
    return RunStore.create(directory, config=config.to_dict(), meta={"study": study})


# -- the result -----------------------------------------------------------------------------------
class StudyResult(Mapping):
    """A study's result: typed fields (in subclasses), read also as the mapping of ``to_dict()``.

    ``to_dict()`` is the JSON-able dict the study writes, keys in the order written; the mapping
    is computed once, so a result is a value (its subclasses are frozen dataclasses).
    """

    kind: ClassVar[str] = ""

    def to_dict(self) -> dict:
        raise NotImplementedError

    @cached_property
    def _written(self) -> dict:
        return self.to_dict()

    def __getitem__(self, key: str) -> Any:
        return self._written[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._written)

    def __len__(self) -> int:
        return len(self._written)


@dataclass(frozen=True, eq=False)
class SeedStudyResult(StudyResult):
    """The result of a seed-based study: its own numbers (``statistics``, from the records), then
    its setup's ``provenance``; where both name a key (metric, seeds, ...) the provenance's value
    is written at the place of the statistics' one."""

    statistics: Mapping[str, Any]
    provenance: Mapping[str, Any]

    def to_dict(self) -> dict:
        return to_jsonable({**self.statistics, **self.provenance})

    @property
    def seeds(self) -> list[int]:
        return list(self.provenance["seeds"])

    @property
    def metric(self) -> str:
        return self.provenance["metric"]

    @property
    def eval_split(self) -> str:
        return self.provenance["eval_split"]

    @property
    def confidence(self) -> float:
        return self.provenance["confidence"]


# -- per-gene samples -----------------------------------------------------------------------------
# what a gene costs, beside its quality: the record's cost objectives (all minimised)
# (not peak memory: on a CPU it is the worker process's high-water mark over every training it ran)
COSTS = ("params", "flops", "train_ms_per_step", "latency_ms")


def samples(records: Mapping[tuple[str, int], Mapping], key: str, seeds: Sequence[int], metric: str) -> dict:
    """``{"seeds", "values", "statuses", "n_failed", "errors", "cost"}`` of one gene (values None
    where failed); ``cost``: each of ``COSTS``, the median over the finished trainings (timings
    are the machine's where they trained, so the median damps one slow neighbour)."""
    rows = [records[key, s] for s in seeds]
    values = [usable_metric(r, metric) for r in rows]
    errors = sorted({str(r.get("error") or r.get("status")) for r, v in zip(rows, values) if v is None})
    cost = {}
    for name in COSTS:
        measured = [v for v in (objective_value(r, name) for r in rows) if v is not None]
        cost[name] = statistics.median(measured) if measured else None
    return {"seeds": list(seeds), "values": values, "statuses": [str(r.get("status")) for r in rows],
            "n_failed": sum(v is None for v in values), "errors": errors, "cost": cost}


def write_json_and_markdown(kind: str, result: Mapping, out_dir: str | os.PathLike, markdown: str) -> dict[str, Path]:
    """Write ``KIND.json`` and ``KIND.md`` (``KIND_test.*`` for the test split) into ``out_dir``;
    returns their paths and the path the caller's figure goes to (``png``)."""
    out = output_dir(out_dir)
    stem = output_stem(kind, result.get("eval_split", "valid"))
    paths = {"json": out / f"{stem}.json", "md": out / f"{stem}.md", "png": out / f"{stem}.png"}
    write_text(paths["json"], dumps(result) + "\n")
    write_text(paths["md"], markdown)
    return paths
