"""The search driver: strategy -> runner/executor -> run store -> strategy, resumable at any point.

    config -> strategy.ask() -> genes -> Runner (cache hit in the store | executor trains) -> store
           -> strategy.tell(fitness) -> store.record_generation -> ... (the report reads the store)

Every finished evaluation is committed to the run store before anything else happens, and the
strategy's proposals depend only on its seed and the fitness values it is told. Resuming is
therefore a replay: a fresh strategy asks again, every evaluation already in the store is a cache
hit, and the run continues exactly where it stopped with the result an uninterrupted run gives.

Every evaluation of a run uses the run's seed (common random numbers: the same initialisation
stream and batch order for every gene), so results never depend on execution order or on the
executor (local, worker processes, Ray), and a gene proposed twice is trained once. The strategy
is told the results in the order of the asked genes, whatever order they finished in.

With several ``objectives`` (perplexity first, then costs such as ``params``) the strategy is told
each gene's objective vector (``train.record.objective_values``) instead of its perplexity; a
resumed run must have the objectives it started with.

With a multi-fidelity schedule (``fidelity: halving``, ``hurdle``; see ``fidelity.py``) a
generation's new genes go through the rungs of the schedule and the strategy is told
``fidelity.told_fitness``; a gene whose full-budget result is known from an earlier generation (or
the baseline) is told that result without going through the rungs. Both rules depend only on
stored results of earlier generations and on this generation's results, so resuming stays a
replay.

Warm start (``init_from``, ``warm_start.py``): generation 0 starts from the best genes of an
earlier run; which ones is decided once, when the run is created, and kept in the store's meta
``init_from``, so a resume replays the same first generation.

Constraints (``max_params``, ``max_flops``, ``max_latency_ms``, ``max_memory_mb``; see
``constraints.py``): after the baseline the driver resolves the run's limits (meta
``constraints``); before training a generation it counts the parameters (and FLOPs) of every new
gene and never trains one over a cap (meta ``infeasible``); the strategy is told each gene's excess
over the caps, read from its costs or its record, so a resume replays the same decisions.

A suite (``suite``: ``data.suites``, scored by ``train.suite``): a gene's fitness request is one
training per point of the suite (each a Trial of ``train.suite.point_config``, with the run's seed,
stored with its role and generation like any other, so a resume retrains nothing), and the
strategy is told the negative of the gene's suite accuracy (the mean accuracy over the points, a
failed point counting 0; the strategy minimises, so ``Individual.fitness`` is the suite accuracy).
A gene whose every point failed is told a failure. The baseline trains on every point too. The run
keeps its suite in the store's meta ``suite`` (``train.suite.suite_meta``: each point's data,
steps, fingerprint and context), from which the report and ``status`` rebuild every score; a resume
refuses a suite that changed since. ``planned`` counts trainings (requests x points). A suite run
has one objective (``suite_accuracy``) and no multi-fidelity, caps, warm start or kept models
(``Config`` and ``Search`` refuse them); trackers get each training but no per-generation line.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from datetime import datetime, timezone
from pathlib import Path

from evo_attention.data.base import TaskData
from evo_attention.genes import AttentionGene
from evo_attention.search import constraints as caps
from evo_attention.search import strategy_from_config
from evo_attention.search.base import Individual, Strategy, best_member
from evo_attention.search.executors import EvalTask, Executor, executor_for
from evo_attention.search.lock import RunLock
from evo_attention.search.models import model_dir, prune as prune_models
from evo_attention.search.fidelity import (RUNG_ROLE, STATE_DIR, fidelity_summary, schedule_from_config,
                                           state_file_name, told_fitness)
from evo_attention.search.runner import Runner
from evo_attention.search.store import RunStore
from evo_attention.search.warm_start import META_KEY as INIT_FROM, initial_genes
from evo_attention.train.config import Config
from evo_attention.train.environment import choose_precision, resolve_device, versions
from evo_attention.train.record import PRIMARY_OBJECTIVE, EvaluationRecord, failed_record, objective_values
from evo_attention.train.spec import Trial, load_task
from evo_attention.train.suite import SuiteScore, point_configs, suite_meta, suite_score
from evo_attention.util.errors import UserError
from evo_attention.util.files import check_directory_path
from evo_attention.util.format import finite_or_none
from evo_attention.util.jsonio import write_json
from evo_attention.util.plugins import load_plugins
from evo_attention.util.progress import SearchView


def planned_evaluations(config: Config, strategy: Strategy | None = None) -> int:
    """Fitness requests a search at ``config`` makes (at most, with a multi-fidelity schedule),
    the baseline included; on a suite, the trainings (one per request and point)."""
    strategy = strategy or strategy_from_config(config)
    schedule = schedule_from_config(config)
    if schedule is None:
        requests = strategy.total_evaluations()
    else:
        requests = sum(schedule.planned(strategy.batch_size(g)) for g in range(strategy.n_generations))
    return (requests + (1 if config.baseline else 0)) * _points(config)


def _points(config: Config) -> int:
    """Trainings per fitness request: the points of the run's suite, else 1."""
    if config.suite is None:
        return 1
    from evo_attention.data.suites import load_suite

    return len(load_suite(config.suite).points)


KEEP_MODELS = "keep_models"  # meta: the run's kept-models count, read back on resume


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Search:
    """Run (or resume) a search into the run directory ``out_dir``; see the module docstring.

    ``population`` (best first) and ``history`` describe the search after the last finished
    generation; ``best`` is the best individual trained on the full budget.
    """

    def __init__(self, config: Config, data: TaskData | None = None, *, out_dir: str | Path | None = None,
                 resume: bool = False, overwrite: bool = False, executor: Executor | None = None,
                 quiet: bool = True, trackers=(), keep_models: int | None = None):
        if keep_models is not None and (isinstance(keep_models, bool) or not isinstance(keep_models, int)
                                        or keep_models < 0):
            raise UserError(f"keep_models must be a non-negative integer, got {keep_models!r}", setting="keep_models")
        # the K best trained models stay in out_dir/models (search/models.py); K is part of the run (meta
        # KEEP_MODELS): None takes the run's on a resume, 0 for a new run
        self.keep_models = keep_models or 0
        self.plugins = load_plugins(config.plugins)  # before the strategy, the space or the data are built
        self.strategy = strategy_from_config(config)  # bad strategy settings fail before any data is read
        self.suite = self._load_suite(config, data, keep_models)  # None: one training per request, on ``data``
        if data is None and self.suite is None:
            from evo_attention.data import data_from_config

            data = data_from_config(config)
        self.config = config
        self.data = data
        self.out_dir = (check_directory_path(out_dir, "out_dir") if out_dir is not None
                        else Path(tempfile.mkdtemp(prefix="evo-attention-")))
        self.executor = executor or executor_for(config)
        if self.executor.name in ("local", "process"):  # trains here: a precision this device lacks is refused
            choose_precision(config.precision, resolve_device(config.device))  # before the run is created
        self.quiet = quiet
        self.trackers = list(trackers)  # search.trackers: views of the run, written by the driver only
        self.schedule = schedule_from_config(config)  # None: every evaluation at the full budget
        self.planned = planned_evaluations(config, self.strategy)
        # the run's full-budget trials (a suite run's are per point: its meta ``suite``)
        self.context = None if self.suite is not None else self._trial(AttentionGene.vanilla().key).context
        if resume and not RunStore.exists(self.out_dir):
            RunStore.open(self.out_dir)  # "no run in ...": said before a lock file is made there
        self.lock = RunLock(self.out_dir).acquire()  # one writer per run directory, before any change to it
        try:
            self.store = self._open_store(resume, overwrite)
            try:
                self.keep_models = self._pinned_keep_models(keep_models)
            except BaseException:
                self.store.close()
                raise
        except BaseException:
            self.lock.release()
            raise
        self.population: list[Individual] = []
        self.history: list[dict] = []
        self.baseline: Individual | None = None
        self._records: dict[str, EvaluationRecord] = {}
        self._scores: dict[str, SuiteScore] = {}  # a suite run: each gene's score (its records on every point)
        self._runner: Runner | None = None
        # constraints: the resolved limits, the costs counted before training, the genes never trained
        self._limits: dict = {}
        self._costs: dict[str, dict] = {}
        self._blocked: dict[str, dict] = {e["gene"]: e for e in self.store.get_meta(caps.META_INFEASIBLE) or []}
        self.init_from: dict | None = self.store.get_meta(INIT_FROM)
        if self.init_from is None and config.init_from is not None and resume:  # a run stored without the meta
            self.init_from = self._initial_genes()
        if self.init_from is not None:
            self.strategy.warm_start([AttentionGene.parse(key) for key in self.init_from["genes"]])

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
            stored = store.get_meta("data") or {}
            if self.suite is not None or store.get_meta("suite") is not None:
                self._check_resumed_suite(store)
            elif stored.get("fingerprint") not in (None, self.data.fingerprint):
                store.close()
                raise UserError(
                    f"the data differs from the data the run in {self.out_dir} started with (fingerprint "
                    f"{stored.get('fingerprint', '')[:12]} vs {self.data.fingerprint[:12]}): point data_dir at the "
                    "original data, or start a new run with overwrite", setting=("data_dir", "overwrite"))
            loaded = {p["module"] for p in self.plugins}
            missing = [p["module"] for p in store.get_meta("plugins") or [] if p["module"] not in loaded]
            if missing:
                store.close()
                raise UserError(f"the run in {self.out_dir} was made with plugin {missing[0]}, which is not loaded: add "
                                f"it to plugins to resume", setting="plugins")
            return store
        meta = {"strategy": {"name": self.config.strategy, "options": self.config.strategy_options},
                "data": self._data_meta(), "versions": versions(), "done": False,
                **({INIT_FROM: self._initial_genes()} if self.config.init_from is not None else {}),
                # trainings of the search itself (a request per gene, times the suite's points); the baseline
                # (config.baseline) comes on top
                "planned": self.strategy.total_evaluations() * _points(self.config),
                "context": self.context, "plugins": self.plugins}
        if self.suite is not None:
            meta["suite"] = self._suite_meta()
        elif self.data.vocab is not None:
            meta["vocab"] = json.loads(self.data.vocab.to_json())
        return RunStore.create(self.out_dir, self.config.to_dict(), meta, overwrite=overwrite)

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

    # -- a suite ---------------------------------------------------------------------------------
    def _load_suite(self, config: Config, data, keep_models: int):
        """The run's suite (None without one), its points' configs and datasets loaded; UserError for
        a suite that cannot be read and for what a suite run does not take."""
        if config.suite is None:
            return None
        from evo_attention.data.suites import load_suite

        suite = load_suite(config.suite)
        if data is not None:
            raise UserError(f"suite {suite.name} names the data of its points: give data or suite, not both",
                            setting=("data", "suite"))
        if keep_models:
            raise UserError(f"keep_models {keep_models} cannot be combined with suite {suite.name}: a gene trains one "
                            "model per point; drop keep_models", setting=("keep_models", "suite"))
        self.point_configs = point_configs(config, suite)
        self.point_data = {label: load_task(c.task) for label, c in self.point_configs.items()}
        return suite

    def _point_trial(self, key: str, label: str) -> Trial:
        return Trial.from_config(key, self.point_configs[label], data=self.point_data[label])

    def _suite_meta(self) -> dict:
        vanilla = AttentionGene.vanilla().key
        return suite_meta(self.suite, {label: self._point_trial(vanilla, label) for label in self.suite.labels})

    def _data_meta(self) -> dict:
        """The meta ``data``: the dataset's description, or a suite run's name for its data."""
        if self.suite is None:
            return self.data.describe()
        return {"name": f"suite {self.suite.name}", "suite": self.suite.name, "points": len(self.suite.points)}

    def _check_resumed_suite(self, store: RunStore) -> None:
        """A resumed suite run must have the suite (points, data, steps, settings) it started with."""
        stored = store.get_meta("suite")
        now = self._suite_meta() if self.suite is not None else None
        identity = ("label", "fingerprint", "steps", "context")
        same = stored is not None and now is not None and (
            [{k: p.get(k) for k in identity} for p in stored.get("points") or []]
            == [{k: p[k] for k in identity} for p in now["points"]])
        if not same:
            store.close()
            was = f"suite {stored['name']}" if stored else "no suite"
            now = f"suite {self.suite.name}" if self.suite else "no suite"
            raise UserError(f"the run in {self.out_dir} started with {was} and is resumed with {now}, whose points "
                            "differ (data, steps or settings): resume with the points it started with, or start a "
                            "new run with overwrite", setting=("suite", "overwrite"))

    def _suite_scores(self, keys: list, *, role: str, generation: int | None) -> dict[str, SuiteScore]:
        """Each gene's score: its trainings on every point, through the runner (stored ones are cache
        hits). Point by point, so that a point's data is built once per worker process."""
        pairs = [(label, key) for label in self.suite.labels for key in keys]
        name = "baseline" if role == "baseline" else f"gen {generation}"
        tasks = [EvalTask(self._point_trial(key, label), role=role, generation=generation, label=f"{name} {label}")
                 for label, key in pairs]
        done = self._runner.evaluate(tasks)
        found: dict[str, dict] = {key: {} for key in keys}
        for (label, key), task in zip(pairs, tasks):
            found[key][label] = done[task]
        scores = {key: suite_score(self.suite.labels, found[key]) for key in keys}
        self._scores.update(scores)
        return scores

    @staticmethod
    def _suite_fitness(score: SuiteScore) -> float | None:
        """What the strategy (a minimiser) is told of a suite score: minus the suite accuracy; a
        failure (None) when every point failed."""
        return None if score.all_failed else -score.aggregate

    def _suite_individual(self, gene: AttentionGene, generation: int, is_elite: bool = False) -> Individual:
        score = self._scores[gene.key]
        told = self._suite_fitness(score)
        return Individual(gene=gene, perplexity=float("inf") if told is None else told, generation=generation,
                          status="failed" if told is None else "ok", is_elite=is_elite)

    def _initial_genes(self) -> dict:
        """The warm start ``init_from`` names (read from the earlier run; its skips are warned)."""
        return initial_genes(self.config.init_from, space=self.strategy.space,
                             population_size=self.config.population_size, objectives=self.config.objectives)

    # -- running -------------------------------------------------------------------------------
    def run(self) -> Individual | None:
        """Run the search to the end (or continue it) and return the best individual."""
        self.store.set_meta("status", "running")
        self._check_threads()
        self.store.set_meta("executor", self.executor.describe())
        self.store.clear_activity()
        for tracker in self.trackers:
            tracker.start(self.out_dir.name, self.config.to_dict())
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
        self.store.set_meta("finished_at", _now())
        return self.best

    def _check_threads(self) -> None:
        """On a CPU a training's sums add in an order that depends on its thread count, so a run
        resumed with other threads (another ``workers`` or ``cpus_per_trial``) may differ from an
        uninterrupted one in the last digits of its later trainings: say so (the run keeps the count
        it started with in its meta ``training_threads``)."""
        ask = getattr(self.executor, "training_threads", None)  # an executor of one's own may not say
        threads = ask() if callable(ask) else None
        started = self.store.get_meta("training_threads")
        if started is None:  # a run stored before the count was kept: the count its trainings measured
            seen = [int(r["latency_threads"]) for r in self.store.evaluations() if r.get("latency_threads")]
            started = max(sorted(set(seen)), key=seen.count) if seen else threads
            if started is not None:
                self.store.set_meta("training_threads", int(started))
        if threads is None or started is None or int(started) == threads:
            return
        from evo_attention.train.environment import resolve_device

        if resolve_device(self.config.device).type != "cpu":
            return
        before = self.store.get_meta("executor") or {}
        how = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in before.items() if v is not None)
        warnings.warn(f"the trainings of this run so far used {started} CPU thread{'s' if int(started) != 1 else ''} "
                      f"each, this session's use {threads}: later trainings may differ from an uninterrupted run in "
                      "the last digits (sums over other threads add in another order); for exact results resume "
                      f"with the executor the run started with{f' ({how})' if how else ''}")

    def _run(self) -> None:
        config = self.config
        with SearchView(self.planned, enabled=not self.quiet) as view, self.executor:
            known = ({config.task: self.data} if self.suite is None else
                     {self.point_configs[label].task: data for label, data in self.point_data.items()})
            self._runner = Runner(self.executor, store=self.store, data=known, view=view,
                                  on_finished=self._finished,
                                  equivalence=getattr(self.strategy.space, "program_space", None) is not None)
            if self.keep_models:
                prune_models(self.out_dir, self.keep_models)  # a resumed run may keep fewer now
            # the baseline gene (Config.resolved_baseline: vanilla, without attention dropout on generated tasks)
            base = config.resolved_baseline()
            if config.baseline and self.suite is not None:
                self._suite_scores([base.key], role="baseline", generation=None)
                self.baseline = self._suite_individual(base, generation=0)
            elif config.baseline:
                record = self._evaluate([self._task(base.key, role="baseline", generation=None)])[base.key]
                self.baseline = self._individual(base, record, generation=0)
            self._resolve_limits()
            while not self.strategy.done:
                generation = self.strategy.generation
                genes = self.strategy.ask()
                told = self._evaluate_generation(genes, generation)
                self.strategy.tell([(g, told[g.key]) for g in genes], violations=self._violations(told))
                members = self.strategy.population[: config.population_size]
                self.store.record_generation(generation, [(m.gene.key, m.perplexity, m.is_elite) for m in members])
                if self.schedule is not None:
                    self.store.set_meta("fidelity", fidelity_summary(self.store.evaluations(), self.schedule))
                self._refresh()
                self.store.checkpoint()  # run.db alone is a complete copy after every generation
                self._after_generation()
                last = self.strategy.history[-1]
                for tracker in self.trackers if self.suite is None else ():  # their lines speak of perplexity
                    tracker.log_generation(generation, finite_or_none(last["best_perplexity"]),
                                           finite_or_none(last["mean_perplexity"]))

    def _after_generation(self) -> None:
        """After every finished generation: a readable snapshot of it (``save_checkpoint``)."""
        self.save_checkpoint()

    def _trial(self, key: str, steps: int | None = None, budget: int | None = None) -> Trial:
        """The trial of gene ``key`` in this run (``steps`` of a ``budget``-step schedule)."""
        return Trial.from_config(key, self.config, steps=steps, budget=budget, data=self.data)

    def _task(self, key: str, *, role: str, generation: int | None, steps: int | None = None,
              budget: int | None = None, label: str | None = None, **fidelity) -> EvalTask:
        steps = self.config.train_steps if steps is None else steps
        keep = self.keep_models and role == "search" and steps == self.config.train_steps
        label = label or ("baseline" if role == "baseline" else f"gen {generation}")
        return EvalTask(self._trial(key, steps, budget), role=role, generation=generation, label=label,
                        keep_model=str(model_dir(self.out_dir, key)) if keep else None, **fidelity)

    def _evaluate(self, tasks: list) -> dict[str, EvaluationRecord]:
        """Records of the tasks by gene key (one task per gene)."""
        return {task.gene: record for task, record in self._runner.evaluate(tasks).items()}

    def _evaluate_generation(self, genes, generation: int) -> dict:
        """The fitness to tell the strategy for each asked gene (by key); a gene over a cap known
        before training is not trained and told a failure (``_check_before_training``)."""
        keys = list(dict.fromkeys(g.key for g in genes))
        blocked = self._check_before_training(keys, generation)
        keys = [k for k in keys if k not in blocked]
        if self.suite is not None:
            scores = self._suite_scores(keys, role="search", generation=generation)
            told = {k: self._suite_fitness(scores[k]) for k in keys}
        elif self.schedule is None:
            records = self._evaluate([self._task(k, role="search", generation=generation) for k in keys])
            told = {k: self._fitness(records[k]) for k in keys}
        else:
            told = self._evaluate_halving(keys, generation)
        told.update({k: None for k in blocked})
        return told

    # -- constraints -----------------------------------------------------------------------------
    def _resolve_limits(self) -> None:
        """The run's limits in their measures' units (relative caps: times the baseline's value),
        kept in the store's meta ``constraints``."""
        given = caps.settings_of(self.config)
        if not given:
            return
        baseline: dict = {}
        if any(caps.cap_factor(v) is not None for v in given.values()):
            base_key = self.config.resolved_baseline().key
            record = self._records.get(base_key) if self.baseline is not None else None
            baseline = caps.record_values(record) if record is not None else {}
            need = [n for n in caps.before_training(given) if caps.cap_factor(given[n]) is not None]
            if any(baseline.get(caps.CAP[n].measure) is None for n in need):
                costs = self._gene_costs(base_key, flops="max_flops" in need)
                baseline.update({"params": costs.get("params"), "flops": costs.get("flops")})
        self._limits = caps.resolve_limits(given, baseline)
        for name, limit in self._limits.items():
            if limit["limit"] is None:
                warnings.warn(f"{name} {limit['given']} is relative to the baseline's {limit['measure']}, which the "
                              "baseline did not measure (its training failed): the cap is not applied")
        self.store.set_meta(caps.META_LIMITS, {"limits": self._limits})

    def _applied(self, before_training: bool = False) -> dict:
        """The limits that apply (all, or those known before training)."""
        return {name: limit for name, limit in self._limits.items() if limit["limit"] is not None
                and (not before_training or caps.CAP[name].before_training)}

    def _gene_costs(self, key: str, *, flops: bool) -> dict:
        """The parameters (and FLOPs) of gene ``key``'s model: from memory, from a stored record or
        the run's list of untrained genes, else counted (``constraints.gene_costs``); None where the
        model cannot be built (its training then fails as any other would)."""
        known = self._costs.get(key) or self._blocked.get(key)
        if known is not None and known.get("uncountable"):
            return known
        if known is None or (flops and known.get("flops") is None):
            record = self.store.lookup(*self._trial(key).key())
            if record is not None and record.get("params") is not None and (
                    not flops or record.get("flops_per_step") is not None):
                known = {"params": record.get("params"), "flops": record.get("flops_per_step")}
        if known is None or (flops and known.get("flops") is None):
            try:
                known = caps.gene_costs(self._trial(key), self.data, flops=flops)
            except Exception as exc:  # a gene whose model cannot be built: its training says why
                warnings.warn(f"cannot count the cost of gene {key} before training ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200] if str(exc) else ''}): it is trained unchecked")
                self._costs[key] = {"params": None, "flops": None, "uncountable": True}
                return self._costs[key]
        self._costs[key] = {"params": known.get("params"), "flops": known.get("flops")}
        return self._costs[key]

    def _check_before_training(self, keys: list, generation: int) -> set:
        """The genes of ``keys`` over a cap known before training (parameters, FLOPs): never
        trained, each kept once in the store's meta ``infeasible`` with its costs and broken caps."""
        limits = self._applied(before_training=True)
        if not limits:
            return set()
        blocked = set()
        for key in keys:
            costs = self._gene_costs(key, flops="max_flops" in limits)
            found = caps.violations_of(costs, limits)
            if not found:
                continue
            blocked.add(key)
            if key not in self._blocked:
                self._blocked[key] = {"gene": key, "generation": generation, **costs, "violations": found}
                self.store.set_meta(caps.META_INFEASIBLE, list(self._blocked.values()))
            if self._runner.view is not None:  # a planned evaluation that will not run
                self._runner.view.refused(f"gen {generation}", key, caps.violations_text(found))
            trial = self._trial(key)
            self._records[key] = failed_record(  # a stand-in for the population, never stored
                key, trial.seed, trial.steps, self.data.name, self.data.fingerprint, trial.context,
                error=f"infeasible before training: {caps.violations_text(self._blocked[key]['violations'])}",
                params=costs.get("params"), flops_per_step=costs.get("flops"))
        return blocked

    def _violations(self, keys) -> dict | None:
        """Each gene's excess over the run's caps (None for a run without caps): from its costs if
        it was never trained, else from its record."""
        limits = self._applied()
        if not limits:
            return None
        out = {}
        for key in keys:
            if key in self._blocked:
                out[key] = caps.excess(self._blocked[key], limits)
            elif key in self._records:
                out[key] = caps.record_excess(self._records[key], limits)
        return out

    def _fitness(self, record: EvaluationRecord, perplexity: float | None = None):
        """What the strategy is told of ``record``: its perplexity (``perplexity`` when given: a
        multi-fidelity schedule's told value), or with several objectives the objective vector."""
        value = record.metric() if perplexity is None else perplexity
        if len(self.config.objectives) == 1:
            return value
        if value is None:
            return None
        return (value,) + objective_values(record, self.config.objectives[1:])

    def _evaluate_halving(self, keys: list, generation: int) -> dict:
        """Successive halving (or a hurdle) over the new genes of a generation (see fidelity.py)."""
        config, schedule = self.config, self.schedule
        reached: dict[str, EvaluationRecord] = {}  # key -> record of the highest rung it reached
        alive = []
        for key in keys:
            known = self.store.lookup(*self._trial(key).key())
            if known is not None and known.role in ("search", "baseline") and (
                    known.generation is None or known.generation < generation):
                reached[key] = known  # its full-budget result is known from before this generation
                self._runner.announce(self._task(key, role="search", generation=generation), known, cached=True)
            else:
                alive.append(key)
        audited = schedule.audited(alive, config.seed, generation)
        for rung, steps in enumerate(schedule.rungs):
            last = rung == len(schedule.rungs) - 1
            tasks = [self._task(key, role="search" if last else RUNG_ROLE, generation=generation, steps=steps,
                                budget=schedule.budget, label=f"gen {generation} rung {rung + 1}/{len(schedule.rungs)}",
                                resume_from=self._state_file(reached.get(key)),
                                save_to=None if last else str(self._state_path(key, steps)), audit=key in audited)
                     for key in alive]
            records = self._evaluate(tasks)
            reached.update({key: records[key] for key in alive})
            if last or not alive:
                break
            promoted = schedule.promote(rung, [(key, records[key]) for key in alive])
            alive = promoted + [key for key in alive if key in audited and key not in promoted
                                and records[key].status == "ok"]
        self._prune_states(reached)
        told = told_fitness(reached)
        return {key: self._fitness(reached[key], told[key]) if told[key] is not None else None for key in told}

    def _state_path(self, key: str, steps: int) -> Path:
        context = self._trial(key, steps, self.schedule.budget).context
        return self.out_dir / STATE_DIR / state_file_name(key, self.config.seed, steps, context)

    def _state_file(self, record: EvaluationRecord | None) -> str | None:
        """The trainer state a record left, if its file is still there."""
        if record is None or not record.checkpoint:
            return None
        path = self.out_dir / record.checkpoint
        return str(path) if path.is_file() else None

    def _prune_states(self, reached: dict) -> None:
        """Delete the trainer states superseded by a higher rung (stopped genes keep theirs)."""
        for key, record in reached.items():
            for steps in self.schedule.rungs:
                if steps < int(record.steps):
                    self._state_path(key, steps).unlink(missing_ok=True)

    def _finished(self, task: EvalTask, record: EvaluationRecord, cached: bool) -> None:
        self.lock.refresh()  # run.lock deleted or replaced meanwhile: its holder's name goes back in
        self._records[task.gene] = record
        if self.keep_models and task.keep_model is not None and not cached:
            prune_models(self.out_dir, self.keep_models)
        if self.trackers:
            tracked = record if record.role is not None else record.replace(role=task.role, generation=task.generation)
            for tracker in self.trackers:
                tracker.log_evaluation(self._runner.done - 1, tracked)
        value = record.metric() if self.suite is None and int(record.steps) >= self.config.train_steps else None
        view = self._runner.view
        if value is not None and view is not None and (view.best is None or value < view.best[1]):
            view.set_best(task.gene, value)

    def _individual(self, gene: AttentionGene, record: EvaluationRecord, generation: int, is_elite: bool = False,
                    perplexity: float | None = None, objectives: tuple = (), violation: float = 0.0) -> Individual:
        value = record.metric() if perplexity is None else perplexity
        status = "infeasible" if gene.key in self._blocked else str(record.status)
        return Individual(gene=gene, perplexity=value if value is not None else float("inf"),
                          train_loss=record.train_loss, generation=generation, status=status,
                          is_elite=is_elite, record=record, steps=record.steps, objectives=objectives,
                          violation=violation)

    def _refresh(self) -> None:
        if self.suite is not None:
            self.population = [self._suite_individual(m.gene, m.generation, m.is_elite)
                               for m in self.strategy.population]
        else:
            self.population = [self._individual(m.gene, self._records[m.gene.key], m.generation, m.is_elite,
                                                perplexity=m.perplexity, objectives=m.objectives,
                                                violation=m.violation)
                               for m in self.strategy.population]
        self.history = [{k: v for k, v in h.items() if k != "members"} for h in self.strategy.history]

    # -- results -------------------------------------------------------------------------------
    @property
    def best(self) -> Individual | None:
        """The individual with the lowest perplexity among those trained on the full budget (of all
        if none was); with one objective the first of them in ``population``."""
        full = [i for i in self.population if i.steps is None or i.steps >= self.config.train_steps]
        return best_member(full or self.population)

    def save_checkpoint(self) -> Path:
        """Snapshot the population and history after the last finished generation into
        ``checkpoints/generation_NNN.json``.

        The run store already holds every evaluation (resume needs nothing else); this JSON is a
        readable view of one generation, loadable with ``load_checkpoint``.
        """
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
