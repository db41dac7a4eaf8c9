"""The search driver: strategy -> runner/executor -> run store -> strategy, resumable at any point.

    config -> strategy.ask() -> genes -> evaluation -> Runner (cache hit in the store | executor trains)
           -> store -> strategy.tell(fitness) -> store.record_generation -> ... (the report reads the store)

The run's evaluation (``evaluation.py``), chosen once from the config, turns the asked genes into the
fitness the strategy is told. Every finished evaluation is committed before anything else happens,
every evaluation uses the run's seed, and a strategy's proposals depend only on its seed and the
values it is told (in the order of the asked genes). Resuming is therefore a replay: a fresh strategy
asks again, every stored evaluation is a cache hit, and the run ends with the result of an
uninterrupted run, whatever the executor. What a run must keep to replay (objectives, kept models,
warm or seeded start, the seeded vanilla gene, plugins, data) is pinned in the store's meta when the
run is created, and a resume that differs is refused.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from contextlib import ExitStack, suppress
from pathlib import Path

from evo_attention.data.base import TaskData
from evo_attention.data.suites import load_suite
from evo_attention.genes import AttentionGene
from evo_attention.search import strategy_from_config
from evo_attention.search.base import Individual, Strategy, best_member
from evo_attention.search.evaluation import evaluation_for
from evo_attention.search.executors import EvalTask, Executor, executor_for
from evo_attention.search.fidelity import schedule_from_config
from evo_attention.search.lock import LOCK_NAME, RunLock
from evo_attention.search.models import KEEP_MODELS
from evo_attention.search.models import prune as prune_models
from evo_attention.search.runner import Runner
from evo_attention.search.store import RunStore
from evo_attention.search.warm_start import META_KEY as INIT_FROM, START_META, initial_genes, starting_genes
from evo_attention.train.config import Config
from evo_attention.train.environment import choose_precision, resolve_device, versions
from evo_attention.train.record import PRIMARY_OBJECTIVE, EvaluationRecord
from evo_attention.util.errors import UserError, check_argument
from evo_attention.util.files import check_directory_path, make_dir
from evo_attention.util.format import finite_or_none, utc_now
from evo_attention.util.jsonio import write_json
from evo_attention.util.plugins import load_plugins, stands_in
from evo_attention.util.progress import SearchView


# the result files of the studies (report.attachments names them): a new run is never started beside them
STUDY_RESULTS = ("validation*.json", "ablation*.json", "compare*.json", "curve.json", "transfer*.json")
# the files other commands write into a search's directory from its store (their results, tables, figures)
STALE_RESULTS = tuple(f"{stem}*.{ext}" for stem in ("validation", "ablation", "compare", "curve", "transfer",
                                                    "fresh_check", "attention_maps") for ext in ("json", "md", "png", "csv"))


def planned_evaluations(config: Config, strategy: Strategy | None = None) -> int:
    """Fitness requests a search at ``config`` makes (at most, with a multi-fidelity schedule),
    the baseline included; on a suite, the trainings (one per request and point)."""
    strategy, schedule = strategy or strategy_from_config(config), schedule_from_config(config)
    requests = strategy.total_evaluations() if schedule is None else sum(
        schedule.planned(strategy.batch_size(g)) for g in range(strategy.n_generations))
    points = 1 if config.suite is None else len(load_suite(config.suite).points)  # trainings per request
    return (requests + (1 if config.baseline else 0)) * points


SEEDED = "seed_vanilla"  # meta: the gene seed_vanilla seeded (Config.vanilla_gene), read back on resume
TRACKED = "trackers"  # meta: per tracker, its tracker run and what it logged (``Search._track``)


class Search:
    """Run (or resume) a search into the run directory ``out_dir``; see the module docstring.

    ``population`` (best first) and ``history`` describe the search after the last finished
    generation; ``best`` is the best individual trained on the full budget.
    """

    def __init__(self, config: Config, data: TaskData | None = None, *, out_dir: str | Path | None = None,
                 resume: bool = False, overwrite: bool = False, executor: Executor | None = None,
                 quiet: bool = True, trackers=(), keep_models: int | None = None):
        check_argument("config", config, Config, "a Config")
        if data is not None:
            check_argument("data", data, TaskData, "a TaskData (evo_attention.data.load_data(name, ...)) or None")
        if executor is not None and not callable(getattr(executor, "run", None)):  # the interface, not the class
            raise TypeError(f"executor must be an Executor (search.executors: it runs tasks) or None, not {executor!r}")
        if out_dir is not None:
            check_argument("out_dir", out_dir, (str, Path), "a directory path or None")
        if keep_models is not None and (isinstance(keep_models, bool) or not isinstance(keep_models, int)
                                        or keep_models < 0):
            raise UserError(f"keep_models must be a non-negative integer, got {keep_models!r}", setting="keep_models")
        # the K best trained models stay in out_dir/models (search/models.py); K is part of the run (meta
        # KEEP_MODELS): None takes the run's on a resume, 0 for a new run
        self.keep_models = keep_models or 0
        self.plugins = load_plugins(config.plugins)  # before the strategy, the space or the data are built
        self.strategy = strategy_from_config(config)  # bad strategy settings fail before any data is read
        self.evaluation = evaluation_for(config, data, keep_models, self.strategy.elite_places)  # the run's data (or suite's) read here
        self.suite, self.data, self.schedule = self.evaluation.suite, self.evaluation.data, self.evaluation.schedule
        self.config = config
        self.out_dir = (check_directory_path(out_dir, "out_dir") if out_dir is not None
                        else Path(tempfile.mkdtemp(prefix="evo-attention-")))
        self.executor = executor or executor_for(config)
        if self.executor.name in ("local", "process"):  # trains here: a precision this device lacks is refused
            choose_precision(config.precision, resolve_device(config.device))  # before the run is created
        self.quiet = quiet
        self.trackers = list(trackers)  # search.trackers: views of the run, written by the driver only
        self.planned = planned_evaluations(config, self.strategy)
        if resume and not RunStore.exists(self.out_dir):
            RunStore.open(self.out_dir)  # "no run in ...": said before a lock file is made there
        fresh = not self.out_dir.exists()
        with ExitStack() as undo:  # a failure lets go of the store and the lock again
            self.lock = RunLock(self.out_dir).acquire()  # one writer per run directory, before any change to it
            undo.callback(self.lock.release)
            if fresh:  # a run refused before its store was made leaves no directory (removed under the lock)
                undo.callback(_remove_if_only_lock, self.out_dir)
            self.store = self._open_store(resume, overwrite)
            undo.callback(self.store.close)
            self.keep_models = self._pinned_keep_models(keep_models)
            undo.pop_all()
        self.population: list[Individual] = []
        self.history: list[dict] = []
        self.baseline: Individual | None = None
        self._runner: Runner | None = None
        self.init_from: dict | None = self.store.get_meta(INIT_FROM)
        if self.init_from is None and config.init_from is not None and resume:  # a run stored without the meta
            self.init_from = self._initial_genes()
        if self.init_from is not None:
            self.strategy.warm_start([AttentionGene.parse(key) for key in self.init_from["genes"]])
        self.start_from: dict | None = self.store.get_meta(START_META)  # resolved once, when the run was made
        if self.strategy.seed_vanilla:  # the gene seed_vanilla seeded when the run was made (a run made before
            seeded = self.store.get_meta(SEEDED)  # this meta seeded the space's vanilla gene: it resumes so)
            self.strategy.vanilla = AttentionGene.parse(seeded) if seeded else self.strategy.space.vanilla()
        if self.start_from is not None:
            self.strategy.warm_start([AttentionGene.parse(key) for key in self.start_from["genes"]], neighbours=True)

    # -- the store -----------------------------------------------------------------------------
    def _open_store(self, resume: bool, overwrite: bool) -> RunStore:
        if resume:
            with RunStore.open(self.out_dir, readonly=True) as stored_run:  # refuse before writing anything
                started = list((stored_run.config() or {}).get("objectives") or [PRIMARY_OBJECTIVE])
                stored_run.check_kind("search")
            if started != list(self.config.objectives):
                raise UserError(
                    f"objectives {','.join(self.config.objectives)} differ from those the run in {self.out_dir} "
                    f"started with ({','.join(started)}): resume with the same objectives, or start a new run with "
                    "overwrite", setting=("objectives", "overwrite"))
            store = RunStore.open(self.out_dir)
            self.evaluation.check_resumed(store)
            missing = [p["module"] for p in store.get_meta("plugins") or []  # a file stands in for one of its name
                       if not any(stands_in(loaded["module"], p["module"]) for loaded in self.plugins)]
            if missing:
                store.close()
                raise UserError(f"the run in {self.out_dir} was made with plugin {missing[0]}, which is not loaded: add "
                                f"it to plugins to resume", setting="plugins")
            return store
        if not RunStore.exists(self.out_dir) and self.out_dir.is_dir():
            found = self._other_results()
            if found:  # another command's results (a study run --from-run elsewhere): never mixed into a run
                raise UserError(f"{self.out_dir} holds {found[0]}, the result of another command: a search writes "
                                "into a directory of its own; choose another out", setting="out")
        replaced = overwrite and RunStore.exists(self.out_dir)
        if replaced:
            self._check_unreadable_beside_results()
        meta = {"strategy": {"name": self.config.strategy, "options": self.config.strategy_options},
                "versions": versions(), "done": False,
                **({INIT_FROM: self._initial_genes()} if self.config.init_from is not None else {}),
                **({START_META: started} if (started := self._starting_genes()) is not None else {}),
                **({SEEDED: self.strategy.vanilla.key} if self.strategy.seed_vanilla else {}),
                # trainings of the search itself (a request per gene, times the suite's points); the baseline
                # (config.baseline) comes on top
                "planned": self.strategy.total_evaluations() * self.evaluation.per_request,
                "plugins": self.plugins, **self.evaluation.meta()}  # data, context, and vocab or suite
        store = RunStore.create(self.out_dir, self.config.to_dict(), meta, overwrite=overwrite)
        if replaced:
            self._delete_stale_results()
        return store

    def _other_results(self) -> list[str]:
        """The result files of other commands (``STUDY_RESULTS``) in the run directory, by name."""
        return sorted(p.name for pattern in STUDY_RESULTS for p in self.out_dir.glob(pattern))

    def _check_unreadable_beside_results(self) -> None:
        """A store that cannot be read may be another command's (a validation's, say): overwrite deletes
        it only where no other command's results lie beside it."""
        try:
            with RunStore.open(self.out_dir, readonly=True):
                return
        except UserError:
            found = self._other_results()
            if found:
                raise UserError(f"{self.out_dir} holds a run store that cannot be read beside {found[0]}, which may be "
                                "its results: a search never deletes what it cannot tell is its own; restore the "
                                "store, or choose another out", setting="out") from None

    def _delete_stale_results(self) -> None:
        """The results other commands built on the search just deleted (a validation, a fresh check,
        ...) go with it: the new run's report never shows them as its own."""
        stale = sorted({p for pattern in STALE_RESULTS for where in ("", "compare/", "curve/")
                        for p in self.out_dir.glob(where + pattern) if p.is_file()})
        for path in stale:
            path.unlink()
        if stale:
            warnings.warn(f"overwrite: the results built on the deleted run are deleted too: "
                          f"{', '.join(str(p.relative_to(self.out_dir)) for p in stale)}", stacklevel=3)

    def _pinned_keep_models(self, given: int | None) -> int:
        """The run's kept-models count: the one it started with (a resume without it takes it; another
        one is refused, since the kept models would differ from the uninterrupted run's)."""
        stored = self.store.get_meta(KEEP_MODELS)
        if stored is None:  # a new run, or one stored before the count was kept: pinned from now on
            self.store.set_meta(KEEP_MODELS, self.keep_models)
            return self.keep_models
        if given is not None and given != stored:
            raise UserError(f"keep_models {given} differs from the {stored} the run in {self.out_dir} started with: "
                            "drop keep_models to resume (the run keeps its count), or start a new run with overwrite",
                            setting=("keep_models", "overwrite"))
        return int(stored)

    def _initial_genes(self) -> dict:
        """The warm start ``init_from`` names (read from the earlier run; its skips are warned)."""
        return initial_genes(self.config.init_from, space=self.strategy.space,
                             population_size=self.config.population_size, objectives=self.config.objectives)

    def _starting_genes(self) -> dict | None:
        """The seeded start ``start_from`` names, else the strategy's ``default_start`` (the climb's and
        the neighbours strategy's: the vanilla gene); None for random draws."""
        text = self.config.start_from or self.strategy.default_start
        if text is None or self.config.init_from is not None:
            return None
        return starting_genes(text, space=self.strategy.space, population_size=self.config.population_size,
                              vanilla=self.config.vanilla_gene().key, objectives=self.config.objectives,
                              default_of=None if self.config.start_from else self.strategy.name)

    # -- running -------------------------------------------------------------------------------
    def run(self) -> Individual | None:
        """Run the search to the end (or continue it) and return the best individual."""
        self.store.set_meta("status", "running")
        self._check_executor_change()
        self.store.set_meta("executor", self.executor.describe())
        self.store.clear_activity()
        # per tracker and destination: its run (a resumed search continues it) and how many evaluations and
        # generations it logged; a resume replays the run from the store in the same order, so those are skipped
        self._tracked = self.store.get_meta(TRACKED) or {}
        for tracker in self.trackers:
            inner = getattr(tracker, "tracker", tracker)  # a Guarded tracker's own: where it logs
            where = getattr(inner, "uri", None) or getattr(inner, "directory", "")
            tracker.state = self._tracked.setdefault(f"{tracker.name}:{where}", {})
            tracker.start(self.out_dir.name, self.config.to_dict())
        if self.trackers:
            self.store.set_meta(TRACKED, self._tracked)
        state = "failed"
        try:
            self._run()
            state = "finished"
        except KeyboardInterrupt:
            state = "interrupted"
            raise
        finally:
            for tracker in self.trackers:
                tracker.finish(state)
        self.store.set_meta("done", True)
        self.store.set_meta("status", "done")
        self.store.set_meta("finished_at", utc_now())
        return self.best

    def _check_executor_change(self) -> None:
        """On a CPU a training's sums add in an order that depends on its thread count, and a folded
        training's (``batch_models``) in one that depends on its batch, so a run resumed with other
        threads (another ``workers`` or ``cpus_per_trial``) or another ``batch_models`` rounds its later
        trainings otherwise, which training amplifies (docs/speed.md): say so in one line (the run
        keeps what it started with in its meta ``training_threads`` and ``training_batch_models``)."""
        ask = getattr(self.executor, "training_threads", None)  # an executor of one's own may not say
        threads = ask() if callable(ask) else None
        started = self.store.get_meta("training_threads")
        before = self.store.get_meta("executor") or {}
        if started is None:  # a run stored before the count was kept: the count its trainings measured
            seen = [int(r["latency_threads"]) for r in self.store.evaluations() if r.get("latency_threads")]
            started = max(sorted(set(seen)), key=seen.count) if seen else threads
            if started is not None:
                self.store.set_meta("training_threads", int(started))
        batching = _batching(self.executor.describe())
        batched = self.store.get_meta("training_batch_models")
        if batched is None:  # a new run, or one stored before it was kept: the executor it ran with last
            batched = _batching(before) if before else batching
            self.store.set_meta("training_batch_models", batched)
        changes = [] if batched == batching else [
            f"trained with batch_models {batched}, this session's with {batching}"]
        if not (threads is None or started is None or int(started) == threads
                or resolve_device(self.config.device).type != "cpu"):
            changes.insert(0, f"used {started} CPU thread{'s' if int(started) != 1 else ''} each, this session's "
                              f"use {threads}")
        if not changes:
            return
        how = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in before.items() if v is not None)
        warnings.warn(f"the trainings of this run so far {' and '.join(changes)}: later trainings may round "
                      "otherwise, which training amplifies (by up to 9% in perplexity for some genes at 40 steps: "
                      "docs/speed.md); trainings already stored keep their results; for exact results resume with the "
                      f"executor the run started with{f' ({how})' if how else ''}")

    def _run(self) -> None:
        config = self.config
        with SearchView(self.planned, enabled=not self.quiet) as view, self.executor:
            self._runner = Runner(self.executor, store=self.store, data=self.evaluation.datasets, view=view,
                                  on_finished=self._finished,
                                  equivalence=getattr(self.strategy.space, "program_space", None) is not None)
            if self.keep_models:
                prune_models(self.out_dir, self.keep_models, self.store)  # a resumed run may keep fewer now
            # the baseline gene (Config.resolved_baseline: vanilla, without attention dropout on generated tasks)
            self.baseline = self.evaluation.start(self._runner, self.keep_models,
                                                  config.resolved_baseline() if config.baseline else None)
            while not self.strategy.done:
                generation = self.strategy.generation
                genes = self.strategy.ask()
                told = self.evaluation.fitness(list(dict.fromkeys(g.key for g in genes)), generation)
                if self.keep_models and config.elite_seeds > 1:  # raced: ranks known now (else pruned per training)
                    prune_models(self.out_dir, self.keep_models, self.store)
                self.strategy.tell([(g, told[g.key]) for g in genes], violations=self.evaluation.violations(told))
                members = self.strategy.population[: config.population_size]
                shown = self.evaluation.shown  # the gene as trained (with its rate under rate_grid), in every view
                self.store.record_generation(generation,
                                             [(shown(m.gene.key), m.perplexity, m.is_elite) for m in members])
                self.population = [self.evaluation.individual(m) for m in self.strategy.population]
                self.history = [{**{k: v for k, v in h.items() if k != "members"}, "best_gene": shown(h["best_gene"])}
                                for h in self.strategy.history]
                self.store.checkpoint()  # run.db alone is a complete copy after every generation
                self._after_generation()
                last = self.strategy.history[-1]
                for tracker in self.trackers if self.suite is None else ():  # a suite's: no perplexity lines
                    self._track(tracker, "generations", generation, finite_or_none(last["best_perplexity"]),
                                finite_or_none(last["mean_perplexity"]))

    def _after_generation(self) -> None:
        """After every finished generation: a readable snapshot of it (``save_checkpoint``)."""
        self.save_checkpoint()

    def _finished(self, task: EvalTask, record: EvaluationRecord, cached: bool) -> None:
        self.lock.refresh()  # run.lock deleted or replaced meanwhile: its holder's name goes back in
        self.evaluation.finished(task, record)
        # a raced run's ranks are known only after a generation's races: it prunes then (search/models.py)
        if self.keep_models and task.keep_model is not None and not cached and not self.config.elite_seeds > 1:
            prune_models(self.out_dir, self.keep_models, self.store)
        if self.trackers:
            tracked = record if record.role is not None else record.replace(role=task.role, generation=task.generation)
            for tracker in self.trackers:
                self._track(tracker, "evaluations", self._runner.done - 1, tracked)

    def _track(self, tracker, what: str, index: int, *args) -> None:
        """Log evaluation or generation ``index`` to ``tracker`` unless an earlier session of the run did."""
        state = tracker.state
        if index < state.get(what, 0):
            return
        (tracker.log_evaluation if what == "evaluations" else tracker.log_generation)(index, *args)
        if not getattr(tracker, "failed", False):  # a failed tracker (``Guarded``) logs it when the run resumes
            state[what] = index + 1
            self.store.set_meta(TRACKED, self._tracked)

    # -- results -------------------------------------------------------------------------------
    @property
    def best(self) -> Individual | None:
        """The individual with the lowest perplexity among those trained on the full budget (of all
        if none was); with one objective the first of them in ``population``."""
        full = [i for i in self.population if i.steps is None or i.steps >= self.config.train_steps]
        return best_member(full or self.population)

    def save_checkpoint(self) -> Path:
        """Snapshot the population and history after the last finished generation into
        ``checkpoints/generation_NNN.json``: a readable view, loadable with ``load_checkpoint`` (resume
        needs nothing but the run store)."""
        generation = self.strategy.generation - 1
        return write_json(make_dir(self.out_dir / "checkpoints") / f"generation_{generation:03d}.json", {
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
                       generation=p["generation"], status=p["status"], is_elite=p["is_elite"], steps=p.get("steps"))
            for p in state["population"]]
        self.history = state["history"]

    def close(self) -> None:
        self.store.close()
        self.lock.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _batching(described: dict):
    """How the executor ``described`` (its ``describe()``) folds trainings: off (1, or Ray: each alone), auto or K."""
    value = described.get("batch_models", "off")
    return "off" if value in (1, "1") else value


def _remove_if_only_lock(run_dir: Path) -> None:
    """Remove ``run_dir`` if it holds nothing but its lock file (a directory this search made)."""
    with suppress(OSError):
        if [p.name for p in run_dir.iterdir()] == [LOCK_NAME]:
            (run_dir / LOCK_NAME).unlink()
            run_dir.rmdir()
