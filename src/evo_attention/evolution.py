"""The search driver: strategy -> executor -> run store -> strategy, resumable at any point.

    config -> strategy.ask() -> genes -> (cache hit in the store | executor trains) -> store.record
           -> strategy.tell(fitness) -> store.record_generation -> ... -> report

Every finished evaluation is committed to the run store before anything else happens, and the
strategy's proposals depend only on its seed and the fitness values it is told. Resuming is
therefore a replay: a fresh strategy asks again, every evaluation already in the store is a cache
hit, and the run continues exactly where it stopped with the result an uninterrupted run gives.

Every evaluation of a run uses the run's seed (common random numbers: the same initialisation
stream and batch order for every gene), so results never depend on execution order, and a gene
proposed twice is trained once.

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
from .executors import EvalTask, Executor, LocalExecutor
from .genes import AttentionGene
from .progress import SearchView
from .search import make_strategy
from .store import RunStore
from .training import training_context, versions


@dataclass
class Individual:
    """A member of the population: ``fitness`` is -perplexity (higher is better, -inf if failed)."""

    gene: AttentionGene
    perplexity: float
    train_loss: float = float("nan")
    generation: int = 0
    status: str = "ok"
    is_elite: bool = False
    record: dict = field(default=None, repr=False, compare=False)

    @property
    def fitness(self) -> float:
        return -self.perplexity if math.isfinite(self.perplexity) else float("-inf")

    def to_dict(self) -> dict:
        return {"gene": self.gene.key, "perplexity": self.perplexity, "fitness": self.fitness,
                "train_loss": self.train_loss, "generation": self.generation, "status": self.status,
                "is_elite": self.is_elite}


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
        self.planned = self.strategy.total_evaluations() + (1 if config.baseline else 0)
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
        with SearchView(self.planned, enabled=not self.quiet) as view, self.executor:
            self._view = view
            if config.baseline:
                vanilla = AttentionGene.vanilla()
                record = self._evaluate([vanilla], role="baseline", generation=None)[vanilla.key]
                self.baseline = self._individual(vanilla, record, generation=0)
            while not self.strategy.done:
                generation = self.strategy.generation
                genes = self.strategy.ask()
                records = self._evaluate(genes, role="search", generation=generation)
                self.strategy.tell([(g, fitness_of(records[g.key])) for g in genes])
                members = self.strategy.population[: config.population_size]
                self.store.record_generation(generation, [(m.gene.key, m.perplexity, m.is_elite) for m in members])
                self._refresh()
                self.save_checkpoint()
        self.store.set_meta("done", True)
        self.store.set_meta("status", "done")
        self.store.set_meta("finished_at", _now())
        if self.write_reports:
            self.write_report()
        return self.population[0]

    def _evaluate(self, genes, *, role: str, generation: int | None) -> dict:
        """Records for the genes: from the store when present, else trained by the executor."""
        config, view = self.config, self._view
        records: dict[str, dict] = {}
        tasks = []
        for key in dict.fromkeys(g.key for g in genes):
            hit = self.store.lookup(key, config.seed, config.train_steps, self.data.fingerprint, self.context)
            label = "baseline" if role == "baseline" else f"gen {generation}"
            if hit is not None:
                records[key] = hit
                self._finish(label, key, hit, cached=True)
            else:
                tasks.append(EvalTask(key, config.seed, config.train_steps, role=role, generation=generation,
                                      label=label))

        def on_start(task):
            view.start(task.label, task.gene, task.steps)

        def on_step(task, step, total, loss):
            view.step(step, total, loss)
            self.store.set_activity(self.executor.name, task.gene, step, total, loss)

        for task, record in self.executor.run(tasks, config, self.data, on_start=on_start, on_step=on_step):
            self.store.record(record, role=task.role, generation=task.generation)
            records[task.gene] = record
            self._finish(task.label, task.gene, record, cached=False)
        self.store.clear_activity()
        return records

    def _finish(self, label: str, key: str, record: dict, cached: bool) -> None:
        self._records[key] = record
        self._completed += 1
        value = fitness_of(record)
        if value is not None and (self._view.best is None or value < self._view.best[1]):
            self._view.set_best(key, value)
        self._view.finished(label, key, record, cached, self._completed)

    def _individual(self, gene: AttentionGene, record: dict, generation: int, is_elite: bool = False) -> Individual:
        value = fitness_of(record)
        return Individual(gene=gene, perplexity=value if value is not None else float("inf"),
                          train_loss=record.get("train_loss", float("nan")), generation=generation,
                          status=record.get("status", "ok"), is_elite=is_elite, record=record)

    def _refresh(self) -> None:
        self.population = [self._individual(m.gene, self._records[m.gene.key], m.generation, m.is_elite)
                           for m in self.strategy.population]
        self.history = [{k: v for k, v in h.items() if k != "members"} for h in self.strategy.history]

    # -- results -------------------------------------------------------------------------------
    @property
    def best(self) -> Individual | None:
        return self.population[0] if self.population else None

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
