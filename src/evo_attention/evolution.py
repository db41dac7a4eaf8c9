"""The search driver: strategy -> executor -> run store -> strategy, resumable at any point.

    config -> strategy.ask() -> genes -> (cache hit in the store | executor trains) -> store.record
           -> strategy.tell(fitness) -> store.record_generation -> ... -> report

Every finished evaluation is committed to the run store before anything else happens, and the
strategy's proposals depend only on its seed and the fitness values it is told. Resuming is
therefore a replay: a fresh strategy asks again, every evaluation already in the store is a cache
hit, and the run continues exactly where it stopped with the result an uninterrupted run gives.

Every evaluation of a run uses the run's seed (common random numbers: the same initialisation
stream and batch order for every gene), so results never depend on execution order or on the
executor (local, worker processes, Ray), and a gene proposed twice is trained once. The strategy
is told the results in the order of the asked genes, whatever order they finished in.

With a multi-fidelity schedule (``--fidelity halving``, ``--hurdle``; see ``fidelity.py``) a
generation's new genes go through the rungs of the schedule and the strategy is told
``fidelity.told_fitness``; a gene whose full-budget result is known from an earlier generation (or
the baseline) is told that result without going through the rungs. Both rules depend only on
stored results of earlier generations and on this generation's results, so resuming stays a
replay.

``Evolution`` is also the original project's Python API::

    evolution = Evolution(config, train_loader, eval_loader)
    best = evolution.run()
    evolution.population[0].perplexity; evolution.history
    evolution.save_results("results"); evolution.plot_history("results/evolution.png")
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .config import Config
from .data.base import TaskData
from .errors import UserError
from .executors import EvalTask, Executor, LocalExecutor, task_context
from .fidelity import CHECKPOINT_DIR, RUNG_ROLE, checkpoint_name, schedule_from_config, summarize, told_fitness
from .genes import AttentionGene
from .progress import SearchView
from .search import make_strategy
from .store import RunStore
from .training import training_context, versions


@dataclass
class Individual:
    """A member of the population: ``fitness`` is -perplexity (higher is better, -inf if failed).

    ``steps`` is the training budget its result was measured at: below the run's budget for an
    individual stopped early by a multi-fidelity schedule (its ``perplexity`` is then what the
    strategy was told, see ``fidelity.told_fitness``).
    """

    gene: AttentionGene
    perplexity: float
    train_loss: float = float("nan")
    generation: int = 0
    status: str = "ok"
    is_elite: bool = False
    record: dict = field(default=None, repr=False, compare=False)
    steps: int | None = None

    @property
    def fitness(self) -> float:
        return -self.perplexity if math.isfinite(self.perplexity) else float("-inf")

    def to_dict(self) -> dict:
        return {"gene": self.gene.key, "perplexity": self.perplexity, "fitness": self.fitness,
                "train_loss": self.train_loss, "generation": self.generation, "status": self.status,
                "is_elite": self.is_elite, "steps": self.steps}


def fitness_of(record: dict) -> float | None:
    """The perplexity a strategy is told: None for a failed evaluation."""
    if record.get("status") != "ok":
        return None
    value = record.get("val_perplexity")
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _data_from_loaders(config: Config, train_loader, eval_loader) -> TaskData:
    from .data import LoaderData

    task = getattr(train_loader, "task_data", None)
    if task is not None and getattr(eval_loader, "task_data", None) is task:
        return task  # loaders made by utils.get_dataloaders: use the dataset behind them
    return LoaderData(train_loader, eval_loader, vocab_size=config.vocab_size, seq_len=config.max_seq_len)


class Evolution:
    """Run (or resume) a search; see the module docstring."""

    def __init__(self, config: Config, train_loader=None, eval_loader=None, *, data: TaskData | None = None,
                 out_dir: str | Path | None = None, resume: bool = False, overwrite: bool = False,
                 executor: Executor | None = None, quiet: bool = True, report: bool = True):
        if data is None:
            if train_loader is not None and eval_loader is not None:
                data = _data_from_loaders(config, train_loader, eval_loader)
            else:
                from .data import data_from_config

                data = data_from_config(config)
        self.config = config
        self.data = data
        self.out_dir = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="evo-attention-"))
        self.executor = executor or LocalExecutor()
        self.quiet = quiet
        self.write_reports = report
        self.strategy = make_strategy(config.strategy, population_size=config.population_size,
                                      n_generations=config.n_generations, elite_size=config.elite_size,
                                      mutation_rate=config.mutation_rate, crossover_rate=config.crossover_rate,
                                      seed=config.seed, space=config.space(), **config.strategy_options)
        self.schedule = schedule_from_config(config)  # None: every evaluation at the full budget
        if self.schedule is None:
            self.planned = self.strategy.total_evaluations() + (1 if config.baseline else 0)
        else:
            self.planned = sum(self.schedule.planned(self.strategy.batch_size(g))
                               for g in range(config.n_generations)) + (1 if config.baseline else 0)
        self.context = training_context(config, "valid")
        self.store = self._open_store(resume, overwrite)
        self.population: list[Individual] = []
        self.history: list[dict] = []
        self.baseline: Individual | None = None
        self._records: dict[str, dict] = {}
        self._completed = 0

    # -- the store -----------------------------------------------------------------------------
    def _open_store(self, resume: bool, overwrite: bool) -> RunStore:
        if resume:
            store = RunStore.open(self.out_dir)
            stored = store.get_meta("data") or {}
            if stored.get("fingerprint") not in (None, self.data.fingerprint):
                store.close()
                raise UserError(
                    f"the data differs from the data the run in {self.out_dir} started with (fingerprint "
                    f"{stored.get('fingerprint', '')[:12]} vs {self.data.fingerprint[:12]}): point --data-dir at the "
                    "original data, or start a new run with --overwrite")
            return store
        meta = {"strategy": {"name": self.config.strategy, "options": self.config.strategy_options},
                "data": self.data.describe(), "versions": versions(), "done": False,
                # fitness requests of the search itself; the baseline (config.baseline) comes on top
                "planned": self.strategy.total_evaluations(),
                "context": self.context}
        if self.data.vocab is not None:
            meta["vocab"] = json.loads(self.data.vocab.to_json())
        return RunStore.create(self.out_dir, self.config.to_dict(), meta, overwrite=overwrite)

    # -- running -------------------------------------------------------------------------------
    def run(self) -> Individual:
        """Run the search to the end (or continue it) and return the best individual."""
        config = self.config
        self.store.set_meta("status", "running")
        self.store.set_meta("executor", self.executor.describe())
        self.store.clear_activity()
        with SearchView(self.planned, enabled=not self.quiet) as view, self.executor:
            self._view = view
            if config.baseline:
                vanilla = AttentionGene.vanilla()
                record = self._evaluate([self._task(vanilla.key, role="baseline", generation=None)])[vanilla.key]
                self.baseline = self._individual(vanilla, record, generation=0)
            while not self.strategy.done:
                generation = self.strategy.generation
                genes = self.strategy.ask()
                told = self._evaluate_generation(genes, generation)
                self.strategy.tell([(g, told[g.key]) for g in genes])
                members = self.strategy.population[: config.population_size]
                self.store.record_generation(generation, [(m.gene.key, m.perplexity, m.is_elite) for m in members])
                if self.schedule is not None:
                    self.store.set_meta("fidelity", summarize(self.store.evaluations(), self.schedule))
                self._refresh()
                self.save_checkpoint()
        self.store.set_meta("done", True)
        self.store.set_meta("status", "done")
        self.store.set_meta("finished_at", _now())
        if self.write_reports:
            self.write_report()
        return self.best

    def _task(self, key: str, *, role: str, generation: int | None, **fidelity) -> EvalTask:
        label = "baseline" if role == "baseline" else f"gen {generation}"
        return EvalTask(key, self.config.seed, fidelity.pop("steps", self.config.train_steps), role=role,
                        generation=generation, label=fidelity.pop("label", label), **fidelity)

    def _evaluate_generation(self, genes, generation: int) -> dict:
        """The fitness to tell the strategy for each asked gene (by key)."""
        keys = list(dict.fromkeys(g.key for g in genes))
        if self.schedule is None:
            records = self._evaluate([self._task(k, role="search", generation=generation) for k in keys])
            return {k: fitness_of(records[k]) for k in keys}
        return self._evaluate_halving(keys, generation)

    def _evaluate_halving(self, keys: list, generation: int) -> dict:
        """Successive halving (or a hurdle) over the new genes of a generation (see fidelity.py)."""
        config, schedule = self.config, self.schedule
        reached: dict[str, dict] = {}  # key -> record of the highest rung it reached
        alive = []
        for key in keys:
            known = self.store.lookup(key, config.seed, schedule.budget, self.data.fingerprint, self.context)
            if known is not None and known.get("role") in ("search", "baseline") and (
                    known.get("generation") is None or known["generation"] < generation):
                reached[key] = known  # its full-budget result is known from before this generation
                self._finish(f"gen {generation}", key, known, cached=True)
            else:
                alive.append(key)
        audited = schedule.audited(alive, config.seed, generation)
        for rung, steps in enumerate(schedule.rungs):
            last = rung == len(schedule.rungs) - 1
            tasks = [self._task(key, role="search" if last else RUNG_ROLE, generation=generation, steps=steps,
                                budget=schedule.budget, label=f"gen {generation} rung {rung + 1}/{len(schedule.rungs)}",
                                resume_from=self._checkpoint_file(reached.get(key)),
                                save_to=None if last else str(self._checkpoint_path(key, steps)), audit=key in audited)
                     for key in alive]
            records = self._evaluate(tasks)
            reached.update({key: records[key] for key in alive})
            if last or not alive:
                break
            promoted = schedule.promote(rung, [(key, records[key]) for key in alive])
            alive = promoted + [key for key in alive if key in audited and key not in promoted
                                and records[key].get("status") == "ok"]
        self._prune_checkpoints(reached)
        return told_fitness(reached)

    def _checkpoint_path(self, key: str, steps: int) -> Path:
        context = task_context(self._task(key, role=RUNG_ROLE, generation=None, steps=steps,
                                          budget=self.schedule.budget), self.config)
        return self.out_dir / CHECKPOINT_DIR / checkpoint_name(key, self.config.seed, steps, context)

    def _checkpoint_file(self, record: dict | None) -> str | None:
        """The checkpoint a record left, if its file is still there."""
        if record is None or not record.get("checkpoint"):
            return None
        path = self.out_dir / record["checkpoint"]
        return str(path) if path.is_file() else None

    def _prune_checkpoints(self, reached: dict) -> None:
        """Delete the checkpoints superseded by a higher rung (stopped genes keep theirs)."""
        for key, record in reached.items():
            for steps in self.schedule.rungs:
                if steps < int(record["steps"]):
                    self._checkpoint_path(key, steps).unlink(missing_ok=True)

    def _evaluate(self, tasks: list) -> dict:
        """Records of the tasks (by gene key): from the store when present, else run by the executor."""
        config, view = self.config, self._view
        records: dict[str, dict] = {}
        todo = []
        for task in {t.gene: t for t in tasks}.values():
            hit = self.store.lookup(task.gene, task.seed, task.steps, self.data.fingerprint, task_context(task, config))
            if hit is not None:
                records[task.gene] = hit
                self._finish(task.label, task.gene, hit, cached=True)
            else:
                todo.append(task)

        def on_start(task):
            view.start(task.label, task.gene, task.budget or task.steps, worker=task.worker)
            self.store.set_activity(task.worker or self.executor.name, task.gene, 0, task.budget or task.steps, None)

        def on_step(task, step, total, loss):
            view.step(step, total, loss, worker=task.worker)
            self.store.set_activity(task.worker or self.executor.name, task.gene, step, total, loss)

        for task, record in self.executor.run(todo, config, self.data, on_start=on_start, on_step=on_step):
            if task.save_to is not None and record.get("status") == "ok" and Path(task.save_to).is_file():
                record["checkpoint"] = Path(task.save_to).relative_to(self.out_dir).as_posix()
            if task.audit:
                record["audit"] = True
            self.store.record(record, role=task.role, generation=task.generation)
            self.store.clear_activity(task.worker or self.executor.name)
            records[task.gene] = record
            self._finish(task.label, task.gene, record, cached=False, worker=task.worker)
        self.store.clear_activity()
        return records

    def _finish(self, label: str, key: str, record: dict, cached: bool, worker: str | None = None) -> None:
        self._records[key] = record
        self._completed += 1
        value = fitness_of(record) if int(record.get("steps", 0)) >= self.config.train_steps else None
        if value is not None and (self._view.best is None or value < self._view.best[1]):
            self._view.set_best(key, value)
        self._view.finished(label, key, record, cached, self._completed, worker=worker)

    def _individual(self, gene: AttentionGene, record: dict, generation: int, is_elite: bool = False,
                    perplexity: float | None = None) -> Individual:
        value = fitness_of(record) if perplexity is None else perplexity
        return Individual(gene=gene, perplexity=value if value is not None else float("inf"),
                          train_loss=record.get("train_loss", float("nan")), generation=generation,
                          status=record.get("status", "ok"), is_elite=is_elite, record=record,
                          steps=record.get("steps"))

    def _refresh(self) -> None:
        self.population = [self._individual(m.gene, self._records[m.gene.key], m.generation, m.is_elite,
                                            perplexity=m.perplexity)
                           for m in self.strategy.population]
        self.history = [{k: v for k, v in h.items() if k != "members"} for h in self.strategy.history]

    # -- results -------------------------------------------------------------------------------
    @property
    def best(self) -> Individual | None:
        """The best individual trained on the full budget (the best of all if none was)."""
        full = [i for i in self.population if i.steps is None or i.steps >= self.config.train_steps]
        return full[0] if full else (self.population[0] if self.population else None)

    def write_report(self) -> dict:
        from .report import write_report

        return write_report(self.out_dir)

    def save_results(self, directory: str | Path) -> Path:
        """Write the report files (final_results.json, evaluations.csv, figures, report.md) into
        ``directory`` (they are regenerated from the run store)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for path in self.write_report().values():
            if path.parent.resolve() != directory.resolve():
                shutil.copy2(path, directory / path.name)
        return directory

    def plot_history(self, path: str | Path) -> Path:
        from .report import load_run
        from .report.plots import plot_evolution

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        plot_evolution(load_run(self.out_dir), path)
        return path

    def save_checkpoint(self) -> Path:
        """Snapshot the population and history after the last finished generation.

        The run store already holds every evaluation (resume needs nothing else); this JSON is a
        readable view of one generation, loadable with ``load_checkpoint``.
        """
        from .jsonio import write_json

        generation = self.strategy.generation - 1
        directory = self.out_dir / "checkpoints"
        directory.mkdir(parents=True, exist_ok=True)
        return write_json(directory / f"generation_{generation:03d}.json", {
            "generation": generation,
            "population": [ind.to_dict() for ind in self.population],
            "history": self.history,
        })

    def load_checkpoint(self, generation: int) -> None:
        """Restore ``population`` and ``history`` as they were after ``generation``."""
        path = self.out_dir / "checkpoints" / f"generation_{generation:03d}.json"
        if not path.is_file():
            raise UserError(f"no checkpoint for generation {generation} in {path.parent}")
        state = json.loads(path.read_text())
        self.population = [
            Individual(gene=AttentionGene.parse(p["gene"]),
                       perplexity=float("inf") if p["perplexity"] is None else p["perplexity"],
                       train_loss=float("nan") if p["train_loss"] is None else p["train_loss"],
                       generation=p["generation"], status=p["status"], is_elite=p["is_elite"])
            for p in state["population"]]
        self.history = state["history"]

    def close(self) -> None:
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
