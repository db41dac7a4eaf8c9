"""The fitness check: can a fitness see the improvements a search is meant to find?

    from evo_attention.studies.fitness import run_fitness_check
    result = run_fitness_check(config, data, suite=None, seeds=10)     # lr: tuned on a grid first
    result.verdicts    # ["this fitness can see output gate in one evaluation with probability 0.97", ...]
    write_fitness_check(result, "runs/fitness")  # fitness_check.json and fitness_check.md

A **fitness** is what a search ranks its candidates by (``Fitness``). The check trains the vanilla
gene (``Config.resolved_baseline``) and each **known improvement** on N seeds, all at one rate, as a
search trains its candidates:

1. **The rate.** Given (``lr``), or the vanilla gene's best of ``lr_grid`` on tuning seeds of their
   own (``studies.common.tuning_seeds``, ``studies.lr_grid.select``); a rate at an end of the grid
   is flagged ``at_edge``.
2. **The points**, the vanilla gene at that rate (``point_row``): mean and sd over the seeds, the
   task's chance and no-recall levels, the share of saturated seeds, the point's share of the summed
   seed-to-seed variance, and a status: ``saturated`` (mean >= CEILING), ``no lookup`` (mean at most
   NO_LOOKUP_MARGIN above the larger of chance and no-recall), ``near ceiling`` (mean > HEADROOM),
   else ``headroom``.
3. **The improvements** (``Improvement``; defaults: ``known_improvements``), by ``ranking``: the
   effect in units of the pooled per-seed sd, and the probability that ONE evaluation of each ranks
   them right, from a normal model of the per-seed values, the lower of paired (a search trains its
   candidates on one seed) and unpaired (``p_one``; ``p_by_evaluations`` for k averaged). An
   **approximation**: with 10 seeds these are estimates, not bounds. Seen when ``p_one >= SEE``.

Every training is a Trial through the runner and the setup's store (role ``fitness-check``): a
repeat trains nothing, an interrupted check resumes. ``fitness_id`` names a fitness apart from its
rate, so a search can find the check of its own fitness (``find_check``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Iterable, Mapping, Sequence

from evo_attention.data.base import TaskData
from evo_attention.data.cache import resolve_cache_dir
from evo_attention.report.studies.fitness import fitness_markdown, improvement_verdict, points_verdict
from evo_attention.search.executors import EvalTask
from evo_attention.studies.common import (SeedStudyResult, StudySetup, scored, study_resources, trained_as,
                                          tuning_seeds, write_files)
from evo_attention.studies.compare import resolve_configs
from evo_attention.studies.lr_grid import select
from evo_attention.train.config import Config, parse_lr_grid
from evo_attention.train.record import usable_metric
from evo_attention.train.spec import Trial, load_task
from evo_attention.train.suite import point_configs, point_result, suite_score
from evo_attention.util.errors import UserError, check_argument
from evo_attention.util.files import output_dir
from evo_attention.util.jsonio import dumps, to_jsonable, write_json

ROLE = "fitness-check"
CEILING = 0.98  # a seed at or above it has no room left above it
HEADROOM = 0.95  # a point has headroom when its mean lies above its floor and at most here
NO_LOOKUP_MARGIN = 0.02  # a mean within this of the task's floor has not learned the lookup
SEE = 0.9  # an improvement is seen when one evaluation ranks it right with at least this probability
DEFAULT_SEEDS = 10
DEFAULT_GRID = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)
DEFAULT_TUNING_SEEDS = 2
DEFAULT_EVALUATIONS = (1, 2, 3, 5)
MAX_EVALUATIONS = 64  # the most evaluations ``evaluations_to_see`` looks for
RESULT_FILE = "fitness_check.json"
CACHED = "fitness-checks"  # the cache directory's folder of checks run here, by fitness id


@dataclass(frozen=True)
class Improvement:
    """A known improvement: ``better`` (a gene key) is expected to score better than ``worse``."""

    name: str
    better: str
    worse: str


def known_improvements(config, language: bool | None = None) -> list[Improvement]:
    """The defaults for a fitness of ``config`` (a point's Config): on language (default: unless
    the config names a generated task), the output gate over the vanilla gene; on a task with
    answers, a width-3 depthwise convolution of q, k and v (``dconv=3``; only in a model without a
    short convolution, which would already mix tokens) and softmax over causal linear attention."""
    vanilla = config.resolved_baseline()
    if not config.generated_task if language is None else language:
        return [Improvement("output gate", vanilla.replace(gating="output_gate").key, vanilla.key)]
    out = [] if config.short_conv else [Improvement("dconv=3", vanilla.replace(qkv_conv=3).key, vanilla.key)]
    return out + [Improvement("softmax over linear", vanilla.key, vanilla.replace(normalization="linear").key)]


def parse_improvement(text: str, config, language: bool | None = None) -> Improvement:
    """``NAME`` (one of ``known_improvements(config)``) or ``NAME=BETTER`` (over the vanilla gene)
    or ``NAME=BETTER>WORSE``, each side a gene string or one of compare's names."""
    known = {i.name: i for i in known_improvements(config, language)}
    text = str(text).strip()
    if "=" not in text.split("|")[0]:
        if text in known:
            return known[text]
        raise UserError(f"improvement {text!r} is not a known one here ({', '.join(known) or 'none'}): give "
                        "NAME=GENE (better than the vanilla gene) or NAME=GENE>GENE", setting="improvements")
    name, _, genes = text.partition("=")
    better, _, worse = genes.partition(">")
    dropout = config.resolved_baseline().attention_dropout if config.generated_task else None

    def gene(spec: str) -> str:
        found = resolve_configs(spec.strip(), config.d_model, config.n_heads, config.max_seq_len, dropout)
        if len(found) != 1:
            raise UserError(f"improvement {text!r}: {spec!r} names {len(found)} genes; give one on each side",
                            setting="improvements")
        return found[0][1].key

    if not name.strip() or not better.strip() or (">" in genes and not worse.strip()):
        raise UserError(f"improvement {text!r} needs a name and a gene on each side it names: NAME=GENE or "
                        "NAME=GENE>GENE", setting="improvements")
    found = Improvement(name.strip(), gene(better), gene(worse) if worse.strip() else config.resolved_baseline().key)
    if found.better == found.worse:
        raise UserError(f"improvement {text!r} compares gene {found.better} with itself: name a better and a worse "
                        "gene", setting="improvements")
    return found


# -- what is measured ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fitness:
    """A fitness: its points (label -> the Config of a training there) and their datasets; one
    point with the config's own data, or a suite's points. On a suite the score of a seed is the
    mean accuracy over the points (a failed training scoring 0, ``train.suite``); else it is the
    validation loss, and a failed training has none."""

    points: Mapping[str, object]
    datasets: Mapping[str, object]
    suite: str | None = None
    weights: tuple | None = None  # a suite's point weights
    records: list = dataclasses.field(default_factory=list, compare=False, repr=False)  # every record, for trained_as

    @classmethod
    def of(cls, config, data=None, suite=None) -> "Fitness":
        if suite is not None:
            configs = point_configs(config, suite)
            return cls(configs, {label: load_task(c.task) for label, c in configs.items()}, suite.name, suite.weights)
        label = str(config.data)
        return cls({label: config}, {label: data if data is not None else load_task(config.task)})

    @property
    def first(self):
        return next(iter(self.points.values()))

    @property
    def language(self) -> bool:
        """Whether the fitness is language modelling: its data has no answer positions (no chance level)."""
        return all(d.describe().get("chance_accuracy") is None for d in self.datasets.values())

    @property
    def mixed(self) -> bool:
        """Whether the fitness has both language points and points with answers (a mixed suite)."""
        return not self.language and any(d.describe().get("chance_accuracy") is None for d in self.datasets.values())

    @property
    def metric(self) -> str:
        """What a search on this fitness ranks by: the suite's mean accuracy, else the perplexity
        (here its log, the validation loss)."""
        return "accuracy" if self.suite is not None else "val_loss"

    @property
    def lower_is_better(self) -> bool:
        return self.metric == "val_loss"

    def score(self, records: Sequence) -> float | None:
        """The fitness of one seed from its records on the points (see the class)."""
        if self.metric == "val_loss":
            return usable_metric(records[0], "val_loss")
        return suite_score(tuple(self.points), dict(zip(self.points, records)), self.weights).aggregate

    def train(self, setup: StudySetup, keys: Sequence[str], seeds: Sequence[int], rate: float,
              labels: Mapping[str, str], role: str = ROLE) -> dict:
        """(gene key, point label, seed) -> the record, every training at ``rate`` through
        the setup's runner and store (one call), stored with ``role``."""
        tasks = {}
        for label, key, seed in itertools.product(self.points, keys, seeds):
            config = self.points[label].replace(learning_rate=float(rate))
            trial = Trial.from_config(key, config, seed=seed, data=self.datasets[label])
            name = f"{labels[key]} " if key in labels else ""  # the progress line shows the gene itself
            tasks[key, label, seed] = EvalTask(trial, role=role, label=f"{name}{label} at lr {rate:g}, seed {seed}")
        datasets = {self.points[label].task: data for label, data in self.datasets.items()}
        done = setup.run(list(tasks.values()), datasets=datasets)
        self.records.extend(done[t] for t in tasks.values())
        return {where: done[t] for where, t in tasks.items()}


def fitness_id(fitness: Fitness) -> str:
    """The fitness's identity apart from its learning rate: a hash of every point's steps, data
    fingerprint and settings (the model, the recipe but its rate, the task)."""
    parts = []
    for label, config in fitness.points.items():
        trial = Trial.from_config(config.resolved_baseline().key, config, seed=0, data=fitness.datasets[label])
        settings = {k: v for k, v in trial.settings().items() if k != "learning_rate"}
        parts.append([label, trial.steps, trial.task.fingerprint, settings])
    return hashlib.sha256(dumps(parts).encode()).hexdigest()[:16]


# -- the statistics --------------------------------------------------------------------------------
def _sd(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) >= 2 else 0.0


def _right(effect: float, spread: float, k: int) -> float:
    """The normal probability that ``k`` evaluations averaged rank a pair right; no spread: 1, 0, or 0.5 (no effect)."""
    z = effect * math.sqrt(k) / spread if spread > 0 else math.copysign(math.inf, effect) if effect else math.nan
    return 0.5 if math.isnan(z) else 0.5 * math.erfc(-z / math.sqrt(2.0))


def ranking(better: Sequence[float | None], worse: Sequence[float | None], lower_is_better: bool,
            evaluations: Sequence[int]) -> dict:
    """How reliably one evaluation (and k, averaged) ranks ``better`` above ``worse`` (per-seed
    values paired by position; a pair with a failed side is left out): see the module docstring."""
    sign = -1.0 if lower_is_better else 1.0
    pairs = [(b, w) for b, w in zip(better, worse) if b is not None and w is not None]
    if len(pairs) < 2:
        return {"n": len(pairs), "effect": None, "effect_sd": None, "p_one": None, "p_by_evaluations": {},
                "seeds_ranked_right": None, "evaluations_to_see": None}
    b, w = [p[0] for p in pairs], [p[1] for p in pairs]
    diffs = [sign * (x - y) for x, y in pairs]
    effect = statistics.fmean(diffs)
    pooled = math.sqrt((_sd(b) ** 2 + _sd(w) ** 2) / 2)
    unpaired, paired = math.sqrt(_sd(b) ** 2 + _sd(w) ** 2), _sd(diffs)

    def p(k: int) -> float:
        return min(_right(effect, unpaired, k), _right(effect, paired, k))

    needed = next((k for k in range(1, MAX_EVALUATIONS + 1) if p(k) >= SEE), None)
    return {"n": len(pairs), "effect": effect, "effect_sd": effect / pooled if pooled else None,
            "sd_better": _sd(b), "sd_worse": _sd(w), "p_one": p(1),
            "p_paired": _right(effect, paired, 1), "p_unpaired": _right(effect, unpaired, 1),
            "p_by_evaluations": {str(k): p(k) for k in evaluations},
            "seeds_ranked_right": sum(d > 0 for d in diffs) + 0.5 * sum(d == 0 for d in diffs),
            "evaluations_to_see": needed}


def point_row(values: Sequence[float], chance: float | None, no_recall: float | None, accuracy: bool) -> dict:
    """The vanilla gene on one point: mean, sd, levels, saturation and status (module docstring); on
    a point without answers (``accuracy`` False: language) its validation losses, mean and sd."""
    mean, sd = statistics.fmean(values), _sd(values)
    row = {"metric": "accuracy" if accuracy else "val_loss", "values": list(values), "mean": mean, "sd": sd,
           "chance": chance, "no_recall": no_recall}
    if not accuracy:
        return {**row, "saturated_share": None, "status": None}
    floor = max(chance or 0.0, no_recall or 0.0)
    status = ("saturated" if mean >= CEILING else "no lookup" if mean <= floor + NO_LOOKUP_MARGIN
              else "near ceiling" if mean > HEADROOM else "headroom")
    return {**row, "floor": floor, "saturated_share": sum(v >= CEILING for v in values) / len(values),
            "status": status}


@dataclass(frozen=True, eq=False)
class FitnessCheckResult(SeedStudyResult):
    """The check's numbers (fitness, rate, points, improvements, verdicts), then the provenance."""

    kind: ClassVar[str] = "fitness_check"

    verdicts = property(lambda self: list(self["verdicts"]))
    saturated = property(lambda self: bool(self["saturated"]))


def run_fitness_check(config, data=None, *, suite=None, seeds: int = DEFAULT_SEEDS, lr: float | None = None,
                      lr_grid: Sequence[float] = DEFAULT_GRID, n_tuning_seeds: int = DEFAULT_TUNING_SEEDS,
                      improvements: Sequence[Improvement | str] | None = None,
                      evaluations: Sequence[int] = DEFAULT_EVALUATIONS, out_dir: str | os.PathLike | None = None,
                      executor="local", store=None, quiet: bool = True,
                      command: str | None = None) -> FitnessCheckResult:
    """Check the fitness of ``config`` (its data, or ``suite``'s points; default the config's
    ``suite``): see the module docstring. ``improvements``: ``Improvement``s or their text
    (``parse_improvement``); None: the defaults. The trainings are kept in ``store``, else in a
    store of ``out_dir`` (role ``fitness-check``; a repeat trains nothing); ``out_dir`` also receives
    the result (``write_fitness_check``). ``executor``: a name for ``executor_for`` or an Executor;
    ``command``: the command line that asked for the check, kept in the result."""
    from evo_attention.data.suites import Suite, load_suite

    check_argument("config", config, Config, "a Config")
    check_argument("seeds", seeds, int, "a whole number of seeds such as 5")
    if data is not None:
        check_argument("data", data, TaskData, "a TaskData (evo_attention.data.load_data(name, ...)) or None")
    for name, value, kinds, wanted in (("evaluations", evaluations, int, "whole numbers such as [1, 3, 5]"),
                                       ("lr_grid", lr_grid, (int, float), "rates such as [1e-3, 2e-3, 4e-3]")):
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) or not all(
                isinstance(v, kinds) and not isinstance(v, bool) for v in value):
            raise TypeError(f"{name} must be a list of {wanted}, not {value!r}")
    if isinstance(improvements, (str, bytes)):  # one text would be read letter by letter
        raise TypeError(f"improvements must be a list of Improvements or their texts, not {improvements!r}")
    if lr is None:
        lr_grid = parse_lr_grid(lr_grid)  # a grid of one rate is a rate: lr
    suite = config.suite if suite is None else suite
    suite = suite if suite is None or isinstance(suite, Suite) else load_suite(suite)
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr)
                           or lr <= 0):
        raise UserError(f"lr must be a positive rate, got {lr!r}", setting="lr")
    ks = sorted({int(k) for k in evaluations})
    if not ks or ks[0] < 1:
        raise UserError(f"evaluations must be positive integers, got {list(evaluations)}", setting="evaluations")
    fitness = Fitness.of(config, data, suite)
    first = fitness.first
    language = fitness.language
    known = known_improvements(first, language)
    if fitness.mixed:  # language and task points: the defaults of both
        known = known_improvements(first, True) + [i for i in known if i.name != "output gate"]
    chosen = [i if isinstance(i, Improvement) else parse_improvement(i, first, language)
              for i in (known if improvements is None else improvements)]
    if not chosen:
        raise UserError("no improvement to check: give at least one (NAME=GENE)", setting="improvements")
    names = [i.name for i in chosen]
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:
        raise UserError(f"improvement {twice!r} is named twice: give each improvement its own name",
                        setting="improvements")
    if out_dir is not None:
        output_dir(out_dir)  # an unwritable place fails now, not after the work
    with study_resources(config, executor, store, out_dir, ROLE) as (executor, store):
        setup = StudySetup.resolve(first, None if suite is not None else fitness.datasets[str(config.data)],
                                   role=ROLE, n_seeds=seeds, seeds_setting="seeds", metric=fitness.metric, store=store,
                                   executor=executor, quiet=quiet)
        result = _check(setup, fitness, chosen, lr, lr_grid, n_tuning_seeds, ks, config.seed, command)
    if out_dir is not None:
        write_fitness_check(result, out_dir)
    return result


def _check(setup: StudySetup, fitness: Fitness, chosen: Sequence[Improvement], lr, lr_grid, n_tuning_seeds: int,
           ks: Sequence[int], base_seed: int, command: str | None) -> FitnessCheckResult:
    vanilla = fitness.first.resolved_baseline().key
    labels = {vanilla: "vanilla"}
    for i in chosen:
        labels.setdefault(i.better, i.name)
        labels.setdefault(i.worse, f"{i.name} (reference)")
    grid = None
    if lr is None:
        rates = list(lr_grid)  # parse_lr_grid's: distinct, increasing, at least two
        tuning = tuning_seeds(base_seed, n_tuning_seeds, verdict_seeds=setup.seeds)
        curve = []
        for rate in rates:
            records = fitness.train(setup, [vanilla], tuning, rate, labels)
            scores = [fitness.score([records[vanilla, label, s] for label in fitness.points]) for s in tuning]
            finished = [v for v in scores if v is not None]
            curve.append({"lr": rate, "values": scores, "mean": statistics.fmean(finished) if finished else None,
                          "n_failed": len(scores) - len(finished)})
        lr = select(curve, fitness.lower_is_better)
        grid = {"rates": rates, "tuning_seeds": tuning, "curve": curve, "selected": lr,
                "at_edge": len(rates) > 1 and lr in (rates[0], rates[-1])}
    keys = list(dict.fromkeys([vanilla] + [k for i in chosen for k in (i.better, i.worse)]))
    records = fitness.train(setup, keys, setup.seeds, lr, labels)
    scores = {key: [fitness.score([records[key, label, s] for label in fitness.points]) for s in setup.seeds]
              for key in keys}
    points = {}
    for label, dataset in fitness.datasets.items():
        described = dataset.describe()
        mine = [records[vanilla, label, s] for s in setup.seeds]
        losses = [v for v in (usable_metric(r, "val_loss") for r in mine) if v is not None]
        if len(losses) < 2:
            raise UserError(f"the vanilla gene finished on {label} on only {len(losses)} of the seeds at lr {lr:g}: "
                            "the fitness cannot be measured there; check the rate (lr) and the point's settings",
                            setting="lr")
        # a suite scores every point by its accuracy (a language point: next-token accuracy, no chance level),
        # a failed training scoring 0 (the suite's rule, ``train.suite``)
        answers = described.get("chance_accuracy") is not None or fitness.suite is not None
        points[label] = point_row([point_result("", r).scored for r in mine] if answers else losses,
                                  described.get("chance_accuracy"), described.get("no_recall_accuracy"), answers)
        points[label].update(scored(mine, [point_result("", r).accuracy if answers else usable_metric(r, "val_loss")
                                           for r in mine]))
    total = sum(p["sd"] ** 2 for p in points.values())
    for row in points.values():
        row["variance_share"] = row["sd"] ** 2 / total if total else None
    saturated = [label for label, p in points.items() if p["status"] == "saturated"]
    rows = [{**dataclasses.asdict(i), **ranking(scores[i.better], scores[i.worse], fitness.lower_is_better, ks)}
            for i in chosen]
    base = [v for v in scores[vanilla] if v is not None]
    numbers = {
        "kind": "fitness_check", "fitness": {"id": fitness_id(fitness), "suite": fitness.suite,
                                             "points": {label: {"data": c.data, "steps": c.train_steps}
                                                        for label, c in fitness.points.items()},
                                             "metric": fitness.metric, "lower_is_better": fitness.lower_is_better},
        "lr": lr, "grid": grid, "vanilla": {"gene": vanilla, "values": scores[vanilla],
                                            "mean": statistics.fmean(base) if base else None, "sd": _sd(base)},
        "points": points, "saturated": bool(points) and len(saturated) == len(points),
        "saturated_points": saturated, "ceiling": CEILING, "headroom_ceiling": HEADROOM, "see": SEE,
        "improvements": rows, "genes": {key: {"name": labels[key], "values": scores[key]} for key in keys},
        "trained_as": trained_as(fitness.records), "command": command,
    }
    numbers["verdicts"] = [points_verdict(numbers)] + [improvement_verdict(row, ks) for row in rows]
    return FitnessCheckResult(to_jsonable(numbers), setup.provenance())


def write_fitness_check(result: Mapping, out_dir: str | os.PathLike, *, cache: bool = True) -> dict[str, Path]:
    """``fitness_check.json`` and ``fitness_check.md`` into ``out_dir``; with ``cache``, a copy of
    the JSON in the cache directory under the fitness's id, where a search finds it (``find_check``)."""
    paths = write_files(out_dir, {"json": RESULT_FILE, "md": "fitness_check.md"}, dict(result),
                        fitness_markdown(result))
    if cache:
        where = resolve_cache_dir() / CACHED
        where.mkdir(parents=True, exist_ok=True)
        write_json(where / f"{result['fitness']['id']}.json", dict(result))
    return paths


COMMITTED = Path(__file__).resolve().parent.parent / "data" / "fitness_checks"  # the checks of the presets


def find_check(fitness_key: str) -> dict | None:
    """The check of the fitness with id ``fitness_key``: a cached one (the newest check run here),
    else a committed one (the presets'); None if there is none."""
    for where in (resolve_cache_dir() / CACHED, COMMITTED):
        for path in sorted(where.glob("*.json")) if where.is_dir() else ():
            try:
                found = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # a damaged file is no check
            if (found.get("fitness") or {}).get("id") == fitness_key:
                return found
    return None


def check_lines(config, data=None) -> list[tuple[str, bool]]:
    """What a search on ``config`` says of the check of its fitness (``find_check``), as
    ``(line, warning)`` pairs: the check's verdicts, a warning when the fitness is saturated at the
    run's rate, or that the check was made at another rate; nothing when no check exists."""
    from evo_attention.data.suites import load_suite

    found = find_check(fitness_id(Fitness.of(config, data, load_suite(config.suite) if config.suite else None)))
    if found is None:
        return []
    seeds = len(found.get("seeds") or [])
    made = f"the fitness check of this fitness ({seeds} seeds at lr {found['lr']:g})"
    if not math.isclose(found["lr"], config.learning_rate, rel_tol=1e-9):
        return [(f"{made} was made at another rate than this run's ({config.learning_rate:g}): its verdicts may not "
                 f"hold here; run evo-attention fitness-check with --lr {config.learning_rate:g} to measure them", True)]
    lines = [(f"fitness check ({seeds} seeds): {verdict}", False) for verdict in found["verdicts"]]
    if found.get("saturated"):
        lines.append((f"this fitness is saturated at lr {found['lr']:g}: the vanilla gene scores >= "
                      f"{found['ceiling']} on every point, so no candidate can show a gain", True))
    return lines
