"""How a search evaluates the genes its strategy asks for: one ``Evaluation`` per run, chosen once
from the config (``evaluation_for``). Every training goes through the runner (a stored one is a
cache hit) and every told value depends only on the run's seed and stored results, so resuming a
run replays it."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import replace
from pathlib import Path

from evo_attention.data import data_from_config
from evo_attention.data.base import TaskData
from evo_attention.data.suites import load_suite
from evo_attention.genes import AttentionGene, gene_label
from evo_attention.search import constraints as caps
from evo_attention.search.base import Individual
from evo_attention.search.executors import EvalTask
from evo_attention.search.fidelity import (RUNG_ROLE, STATE_DIR, Schedule, fidelity_summary, schedule_from_config,
                                           state_file_name, told_fitness)
from evo_attention.search.models import model_dir
from evo_attention.search.racing import Racing
from evo_attention.search.runner import Runner
from evo_attention.search.store import RunStore
from evo_attention.search.tuning import Tuned
from evo_attention.train.config import Config
from evo_attention.train.record import EvaluationRecord, failed_record, objective_values
from evo_attention.train.spec import Trial, load_task
from evo_attention.train.suite import point_configs, suite_meta, suite_score
from evo_attention.util.errors import UserError


def evaluation_for(config: Config, data: TaskData | None, keep_models: int | None, elite_places: int = 1):
    """The evaluation ``config`` asks for, its data (unless given) or its suite's points read; with
    ``rate_grid`` every gene at its best rate of the grid (``search.tuning``); with ``elite_seeds`` > 1
    the strategy's ``elite_places`` are raced (``search.racing``)."""
    if config.suite is not None:
        evaluation = Suite(config, data, keep_models)
    else:
        data = data_from_config(config) if data is None else data
        schedule = schedule_from_config(config)
        evaluation = (Plain if schedule is None else Halving)(config, data, schedule)
        evaluation = Capped(evaluation) if caps.settings_of(config) else evaluation
    evaluation = Tuned(evaluation, config.rate_grid) if config.rate_grid else evaluation
    return Racing(evaluation, config.elite_seeds, elite_places) if config.elite_seeds > 1 else evaluation


class Evaluation:
    """The interface of the driver's loop: ``meta()`` (a new run's meta on what a gene trains on),
    ``check_resumed(store)``, ``datasets`` (the runner's, by task), ``start(runner, keep_models,
    baseline)`` (evaluate through ``runner`` from now on; the baseline gene's individual or None),
    ``fitness(keys, generation)`` (what to tell the strategy by key; keys unique, in asked order),
    ``violations(told)`` (each key's excess over the caps; None: no caps), ``shown(key)`` (the key an
    asked gene trains as), ``individual(member)`` (a population member as shown), ``finished(task,
    record)`` (every task the runner answers); ``config``, ``suite``, ``data``, ``schedule`` (or None);
    ``per_request`` (trainings per fitness request)."""

    suite = data = schedule = None
    per_request = 1  # trainings per fitness request (a suite's: one per point)

    def start(self, runner: Runner, keep_models: int, baseline: AttentionGene | None) -> Individual | None:
        self.runner, self.store, self.keep_models = runner, runner.store, keep_models
        return None if baseline is None else self.baseline(baseline)

    def check_resumed(self, store: RunStore) -> None:
        """Refuse (the store closed) to resume a run on other data, or on another suite."""
        def points(suite: dict | None) -> list | None:  # what a resume must keep of a suite's points
            return None if suite is None else [{k: p.get(k) for k in ("label", "fingerprint", "steps", "context")}
                                               for p in suite.get("points") or []]

        stored = store.get_meta("suite")
        if points(stored) != points(self.meta().get("suite")):
            store.close()
            was = f"suite {stored['name']}" if stored else "no suite"
            now = f"suite {self.suite.name}" if self.suite else "no suite"
            raise UserError(f"the run in {store.run_dir} started with {was} and is resumed with {now}, whose points "
                            "differ (data, steps or settings): resume with the points it started with, or start a "
                            "new run with overwrite", setting=("suite", "overwrite"))
        fingerprint = (store.get_meta("data") or {}).get("fingerprint")
        if self.data is not None and fingerprint not in (None, self.data.fingerprint):
            store.close()
            raise UserError(
                f"the data differs from the data the run in {store.run_dir} started with (fingerprint "
                f"{fingerprint[:12]} vs {self.data.fingerprint[:12]}): point data_dir at the original data, or start "
                "a new run with overwrite", setting=("data_dir", "overwrite"))

    def fitness(self, keys: list, generation: int | None, role: str = "search") -> dict:
        """What to tell the strategy of each gene (by key): its ``scores`` on the run's seed."""
        told = self.scores([(k, self.config.seed) for k in keys], generation, role)
        return {k: told[k, self.config.seed] for k in keys}

    def violations(self, told: dict) -> None:
        return None

    def shown(self, key: str) -> str:
        """The key a gene the strategy asked for is trained and shown as (``Tuned``: with its rate)."""
        return key

    def finished(self, task: EvalTask, record: EvaluationRecord) -> None:
        pass


class Plain(Evaluation):
    """One training per gene at the full budget on the run's dataset, told its perplexity, or with
    several ``objectives`` its objective vector (``train.record.objective_values``)."""

    def __init__(self, config: Config, data: TaskData, schedule: Schedule | None = None):
        self.config, self.data, self.schedule, self.datasets = config, data, schedule, {config.task: data}
        self.records: dict[str, EvaluationRecord] = {}  # each gene's last answered record

    def meta(self) -> dict:
        vocab = {"vocab": json.loads(self.data.vocab.to_json())} if self.data.vocab is not None else {}
        return {"data": self.data.describe(), "context": self.trial(AttentionGene.vanilla().key).context, **vocab}

    def baseline(self, gene: AttentionGene) -> Individual:
        value = self.evaluate([self.task(gene.key, role="baseline", generation=None)])[gene.key].metric()
        return self.individual(Individual(gene, math.inf if value is None else value))

    def scores(self, pairs: list, generation: int | None, role: str = "search") -> dict:
        """What the strategy would be told of each ``(gene key, seed)`` pair, trained at the full budget."""
        tasks = {(key, seed): self.task(key, role=role, generation=generation, seed=seed) for key, seed in pairs}
        done = self.runner.evaluate(list(tasks.values()))
        return {pair: self.told(done[task]) for pair, task in tasks.items()}

    def individual(self, member: Individual) -> Individual:
        record = self.records[member.gene.key]
        return replace(member, train_loss=record.train_loss, status=str(record.status), record=record,
                       steps=record.steps)

    def finished(self, task: EvalTask, record: EvaluationRecord) -> None:
        if task.seed != self.config.seed:  # a re-measurement (racing): the individual shows its run-seed record
            return
        self.records[task.gene] = record
        value = record.metric() if int(record.steps) >= self.config.train_steps else None
        view = self.runner.view
        if value is not None and view is not None and (view.best is None or value < view.best[1]):
            view.set_best(gene_label(task.gene), value)

    def trial(self, key: str, steps: int | None = None, budget: int | None = None, seed: int | None = None) -> Trial:
        return Trial.from_config(key, self.config, seed=seed, steps=steps, budget=budget, data=self.data)

    def task(self, key: str, *, role: str, generation: int | None, steps: int | None = None,
             budget: int | None = None, label: str | None = None, seed: int | None = None, **fidelity) -> EvalTask:
        steps = self.config.train_steps if steps is None else steps
        keep = self.keep_models and role == "search" and steps == self.config.train_steps
        label = label or ("baseline" if role == "baseline" else f"gen {generation}") + (
            f" seed {seed}" if seed not in (None, self.config.seed) else "")
        return EvalTask(self.trial(key, steps, budget, seed), role=role, generation=generation, label=label,
                        keep_model=str(model_dir(self.store.run_dir, key)) if keep else None, **fidelity)

    def evaluate(self, tasks: list) -> dict[str, EvaluationRecord]:  # by gene key (one task per gene)
        return {task.gene: record for task, record in self.runner.evaluate(tasks).items()}

    def told(self, record: EvaluationRecord, perplexity: float | None = None):
        """What the strategy is told of ``record``: its perplexity (or ``perplexity``, a schedule's
        told value), or with several objectives the objective vector."""
        value = record.metric() if perplexity is None else perplexity
        if len(self.config.objectives) == 1 or value is None:
            return value
        return (value,) + objective_values(record, self.config.objectives[1:])


class Halving(Plain):
    """A multi-fidelity schedule (``fidelity: halving``, ``hurdle``; see ``fidelity.py``): a generation's
    new genes go through its rungs and the strategy is told ``fidelity.told_fitness``; a gene whose
    full-budget result is known from an earlier generation (or the baseline) is told that result. Both
    rules depend only on stored results of earlier generations and on this generation's, so resuming
    stays a replay. The store's meta ``fidelity`` is the ``fidelity_summary`` after every generation."""

    def fitness(self, keys: list, generation: int) -> dict:
        schedule = self.schedule
        reached: dict[str, EvaluationRecord] = {}  # key -> record of the highest rung it reached
        alive = []
        for key in keys:
            known = self.store.lookup(*self.trial(key).key())
            if known is not None and known.role in ("search", "baseline") and (
                    known.generation is None or known.generation < generation):
                reached[key] = known  # its full-budget result is known from before this generation
                self.runner.announce(self.task(key, role="search", generation=generation), known, cached=True)
            else:
                alive.append(key)
        audited = schedule.audited(alive, self.config.seed, generation)
        for rung, steps in enumerate(schedule.rungs):
            last = rung == len(schedule.rungs) - 1
            tasks = [self.task(key, role="search" if last else RUNG_ROLE, generation=generation, steps=steps,
                               budget=schedule.budget, label=f"gen {generation} rung {rung + 1}/{len(schedule.rungs)}",
                               resume_from=self._state_file(reached.get(key)),
                               save_to=None if last else str(self._state_path(key, steps)), audit=key in audited)
                     for key in alive]
            records = self.evaluate(tasks)
            reached.update({key: records[key] for key in alive})
            if last or not alive:
                break
            promoted = schedule.promote(rung, [(key, records[key]) for key in alive])
            alive = promoted + [key for key in alive if key in audited and key not in promoted
                                and records[key].status == "ok"]
        for key, record in reached.items():  # states superseded by a higher rung (stopped genes keep theirs)
            for steps in schedule.rungs:
                if steps < int(record.steps):
                    self._state_path(key, steps).unlink(missing_ok=True)
        self.store.set_meta("fidelity", fidelity_summary(self.store.evaluations(), schedule))
        told = told_fitness(reached)
        return {key: self.told(reached[key], told[key]) if told[key] is not None else None for key in told}

    def _state_path(self, key: str, steps: int) -> Path:
        context = self.trial(key, steps, self.schedule.budget).context
        return self.store.run_dir / STATE_DIR / state_file_name(key, self.config.seed, steps, context)

    def _state_file(self, record: EvaluationRecord | None) -> str | None:  # the trainer state it left, if there
        path = self.store.run_dir / record.checkpoint if record is not None and record.checkpoint else None
        return str(path) if path is not None and path.is_file() else None


class Suite(Evaluation):
    """A suite (``suite``: ``data.suites``, scored by ``train.suite``): a gene's fitness request is one
    training per point (a Trial of ``train.suite.point_config`` with the run's seed, stored with its
    role and generation like any other, so a resume retrains nothing), and the strategy is told minus
    the gene's suite accuracy (the mean accuracy over the points, a failed point counting 0; so
    ``Individual.fitness`` is the suite accuracy); a gene whose every point failed is told a failure.
    The baseline trains on every point too. The store's meta ``suite`` (``train.suite.suite_meta``:
    each point's data, steps, fingerprint and context) lets the report and ``status`` rebuild every
    score; a resume refuses a suite that changed since. ``planned`` counts trainings (requests x
    points). One objective (``suite_accuracy``); no multi-fidelity, caps, warm start or kept models
    (``Config`` and this class refuse them); trackers get each training, no per-generation line."""

    def __init__(self, config: Config, data: TaskData | None, keep_models: int | None):
        self.suite = load_suite(config.suite)
        if data is not None:
            raise UserError(f"suite {self.suite.name} names the data of its points: give data or suite, not both",
                            setting=("data", "suite"))
        if keep_models:
            raise UserError(f"keep_models {keep_models} cannot be combined with suite {self.suite.name}: a gene "
                            "trains one model per point; drop keep_models", setting=("keep_models", "suite"))
        self.per_request = len(self.suite.points)
        self.point_configs = point_configs(config, self.suite)
        self.point_data = {label: load_task(c.task) for label, c in self.point_configs.items()}
        self.config, self.datasets = config, {self.point_configs[label].task: d for label, d in self.point_data.items()}

    def meta(self) -> dict:
        suite = self.suite
        trials = {label: self._point_trial(AttentionGene.vanilla().key, label) for label in suite.labels}
        return {"data": {"name": f"suite {suite.name}", "suite": suite.name, "points": len(suite.points)},
                "context": None, "suite": suite_meta(suite, trials)}

    def _point_trial(self, key: str, label: str, seed: int | None = None) -> Trial:
        return Trial.from_config(key, self.point_configs[label], seed=seed, data=self.point_data[label])

    def baseline(self, gene: AttentionGene) -> Individual:
        told = self.fitness([gene.key], None, role="baseline")[gene.key]
        return self.individual(Individual(gene, math.inf if told is None else told))

    def scores(self, pairs: list, generation: int | None, role: str = "search") -> dict:
        """Minus the suite accuracy of each ``(gene key, seed)`` pair (None: every point failed); point
        by point, so that a point's data is built once per worker process."""
        name, labels = "baseline" if role == "baseline" else f"gen {generation}", self.suite.labels
        seeds = lambda seed: "" if seed == self.config.seed else f" seed {seed}"  # noqa: E731
        tasks = {(label, key, seed): EvalTask(self._point_trial(key, label, seed), role=role, generation=generation,
                                              label=f"{name}{seeds(seed)} {label}")
                 for label in labels for key, seed in pairs}
        done = self.runner.evaluate(list(tasks.values()))
        scores = {(key, seed): suite_score(labels, {label: done[tasks[label, key, seed]] for label in labels},
                                           self.suite.weights)
                  for key, seed in pairs}
        return {pair: None if score.all_failed else -score.aggregate for pair, score in scores.items()}

    def individual(self, member: Individual) -> Individual:
        return replace(member, status="failed" if member.failed else "ok")


class Capped:
    """Caps (``max_params``, ``max_flops``, ``max_latency_ms``, ``max_memory_mb``; ``constraints.py``):
    a filter in front of a ``Plain`` or ``Halving`` evaluation, which it stands for otherwise. After the
    baseline it resolves the run's limits (meta ``constraints``); a gene over a cap known before training
    (parameters, FLOPs) is never trained (meta ``infeasible``) and told a failure. The strategy is told
    each gene's excess, read from its costs or its record, so a resume replays the same decisions."""

    def __init__(self, inner: Plain):
        self.inner = inner
        self.limits, self.costs = {}, {}  # the resolved limits that apply; costs counted before training
        self.blocked: dict[str, dict] = {}  # the genes never trained (meta ``infeasible``)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def start(self, runner: Runner, keep_models: int, baseline: AttentionGene | None) -> Individual | None:
        self.blocked = {e["gene"]: e for e in runner.store.get_meta(caps.META_INFEASIBLE) or []}
        individual = self.inner.start(runner, keep_models, baseline)
        self._resolve_limits()
        return None if individual is None else self.individual(individual)

    def fitness(self, keys: list, generation: int) -> dict:
        blocked = self._check_before_training(keys, generation)
        return {**self.inner.fitness([k for k in keys if k not in blocked], generation), **dict.fromkeys(blocked)}

    def individual(self, member: Individual) -> Individual:
        individual = self.inner.individual(member)
        return replace(individual, status="infeasible") if member.gene.key in self.blocked else individual

    def violations(self, told: dict) -> dict | None:
        """Each gene's excess over the caps: from its costs if it was never trained, else its record."""
        if not self.limits:
            return None
        return {key: caps.excess(self.blocked[key], self.limits) if key in self.blocked
                else caps.record_excess(self.records[key], self.limits) for key in told}

    def _resolve_limits(self) -> None:
        """The run's limits in their measures' units (relative caps: times the baseline's value),
        kept in the store's meta ``constraints``."""
        given = caps.settings_of(self.config)
        baseline: dict = {}
        if any(caps.cap_factor(v) is not None for v in given.values()):
            base_key = self.config.resolved_baseline().key
            record = self.records.get(base_key)  # the baseline's (nothing else is trained yet), if it was
            baseline = caps.record_values(record) if record is not None else {}
            need = [n for n in given if caps.CAP[n].before_training and caps.cap_factor(given[n]) is not None]
            if any(baseline.get(caps.CAP[n].measure) is None for n in need):
                costs = self._gene_costs(base_key, flops="max_flops" in need)
                baseline.update({"params": costs.get("params"), "flops": costs.get("flops")})
        limits = caps.resolve_limits(given, baseline)
        for name, limit in limits.items():
            if limit["limit"] is None:
                warnings.warn(f"{name} {limit['given']} is relative to the baseline's {limit['measure']}, which the "
                              "baseline did not measure (its training failed): the cap is not applied")
        self.store.set_meta(caps.META_LIMITS, {"limits": limits})
        self.limits = {name: limit for name, limit in limits.items() if limit["limit"] is not None}

    def _gene_costs(self, key: str, *, flops: bool) -> dict:
        """The parameters (and FLOPs) of gene ``key``'s model: from memory, a stored record or the
        untrained genes, else counted; None where the model cannot be built (its training says why)."""
        known = self.costs.get(key) or self.blocked.get(key)
        if known is not None and known.get("uncountable"):
            return known
        if known is None or (flops and known.get("flops") is None):
            record = self.store.lookup(*self.trial(key).key())
            if record is not None and record.get("params") is not None and (
                    not flops or record.get("flops_per_step") is not None):
                known = {"params": record.get("params"), "flops": record.get("flops_per_step")}
        if known is None or (flops and known.get("flops") is None):
            try:
                known = caps.gene_costs(self.trial(key), self.data, flops=flops)
            except Exception as exc:  # a gene whose model cannot be built: its training says why
                warnings.warn(f"cannot count the cost of gene {key} before training ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200] if str(exc) else ''}): it is trained unchecked")
                self.costs[key] = {"params": None, "flops": None, "uncountable": True}
                return self.costs[key]
        self.costs[key] = {"params": known.get("params"), "flops": known.get("flops")}
        return self.costs[key]

    def _check_before_training(self, keys: list, generation: int) -> list:
        """The genes of ``keys`` over a cap known before training (parameters, FLOPs): never
        trained, each kept once in the store's meta ``infeasible`` with its costs and broken caps."""
        limits = {name: limit for name, limit in self.limits.items() if caps.CAP[name].before_training}
        blocked = []
        for key in keys if limits else ():
            costs = self._gene_costs(key, flops="max_flops" in limits)
            found = caps.violations_of(costs, limits)
            if not found:
                continue
            blocked.append(key)
            if key not in self.blocked:
                self.blocked[key] = {"gene": key, "generation": generation, **costs, "violations": found}
                self.store.set_meta(caps.META_INFEASIBLE, list(self.blocked.values()))
            if self.runner.view is not None:  # a planned evaluation that will not run
                self.runner.view.refused(f"gen {generation}", key, caps.violations_text(found))
            trial = self.trial(key)
            self.records[key] = failed_record(  # a stand-in for the population, never stored
                key, trial.seed, trial.steps, self.data.name, self.data.fingerprint, trial.context,
                error=f"infeasible before training: {caps.violations_text(self.blocked[key]['violations'])}",
                params=costs.get("params"), flops_per_step=costs.get("flops"))
        return blocked
