"""What the seed-based studies share: one setup, one result shape, per-gene samples, and writing a
result as JSON + markdown.

``StudySetup`` is what validate, ablate, transfer and compare repeat, resolved once (``resolve``): the
config and data, seeds, steps, split, metric and confidence, and where the trainings run and are kept
(executor, run store). Its ``train`` runs every (gene, seed) pair as a ``Trial`` through the ``Runner``
(a stored pair is read back, never trained again; each new record is stored as it finishes); its
``provenance`` is the settings block every result carries. ``StudyResult`` is what a study returns:
typed fields, and the read-only mapping of exactly what it writes (``result.genes`` is ``result["genes"]``).

The seeds of a study are ``seed + 1 ... seed + N``, never the search seed on which a search picked its
winners (the winner's curse). A learning-rate grid selects each gene's rate on the *tuning seeds*
``seed + 1001 ... seed + 1000 + T`` (``tuning_seeds``), a block that no verdict seed reaches.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections import Counter
from collections.abc import Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Iterator, Sequence

from evo_attention.genes import AttentionGene
from evo_attention.report.attachments import output_stem
from evo_attention.report.studies.common import metric_info
from evo_attention.search.executors import EvalTask, Executor, executor_for
from evo_attention.search.lock import RunLock
from evo_attention.search.runner import Runner
from evo_attention.search.store import STUDY, RunStore
from evo_attention.train.config import MAX_SEED, parse_lr_grid
from evo_attention.train.record import EvaluationRecord, objective_value, usable_metric
from evo_attention.train.spec import Trial
from evo_attention.util import stats
from evo_attention.util.errors import UserError
from evo_attention.util.files import output_dir, write_text
from evo_attention.util.format import utc_now
from evo_attention.util.jsonio import to_jsonable, write_json
from evo_attention.util.progress import SearchView

DEFAULT_SEEDS = 5
DEFAULT_MARGIN = stats.DEFAULT_MARGIN  # the equivalence margin (see util.stats)
DEFAULT_POWER = 0.8
PILOT_SEEDS = 3  # seeds of the pilot that plans a validation's seeds (--seeds auto)
DEFAULT_MAX_SEEDS = 30
ANALYSIS = stats.ANALYSIS
DEFAULT_TUNING_SEEDS = 2  # seeds per rate of a learning-rate grid
TUNING_OFFSET = 1000  # the tuning seeds are seed + TUNING_OFFSET + 1 ...: a block no verdict seed reaches
# Seed blocks: the studies of several units (the validations of several searches) each draw their
# seeds from a block of their own, so no seed serves two units. Block K is the seeds
# SEED_BLOCK_BASE + K * SEED_BLOCK_SIZE + 1 ... + SEED_BLOCK_SIZE; its first half holds the verdict
# seeds (planned ones included), its second the tuning seeds of a grid (TUNING_OFFSET on).
SEED_BLOCK_SIZE = 2 * TUNING_OFFSET
SEED_BLOCK_BASE = 1_000_000
MAX_SEED_BLOCK = 10 ** 12  # its seeds stay far inside a 64-bit integer (a store's column, a generator's seed)

Records = dict[tuple[str, int], EvaluationRecord]  # (gene key, seed) -> record
FinishedFn = Callable[[EvalTask, EvaluationRecord, bool], None]  # the runner's (task, record, cached)


def gene_keys(genes: Iterable[AttentionGene | str]) -> list[str]:
    """The distinct keys of ``genes`` (genes or their texts), in the order given."""
    return list(dict.fromkeys(AttentionGene.parse(g).key for g in genes))


def validation_seeds(base_seed: int, n: int, search_seed: int | None = None, *, minimum: int = 2,
                     setting: str = "n_seeds") -> list[int]:
    """``base_seed + 1 ... base_seed + n``; refuses fewer than ``minimum`` seeds (a spread and an
    interval need 2) and a list that holds ``search_seed``."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise UserError(f"{setting} {n!r} is not a number of seeds: give a whole number such as 5", setting=setting)
    if n < minimum:
        why = ("a spread and a confidence interval need at least 2 seeds" if minimum >= 2
               else "give a positive number of seeds")
        raise UserError(f"{setting} {n!r} is too few: {why}", setting=setting)
    seeds = list(range(int(base_seed) + 1, int(base_seed) + n + 1))
    if seeds and seeds[-1] > MAX_SEED:
        raise UserError(f"the validation seeds {seeds[0]}..{seeds[-1]} pass 2^63-1: give a smaller "
                        "seed", setting="seed")
    if search_seed is not None and search_seed in seeds:
        raise UserError(f"the validation seeds {seeds[0]}..{seeds[-1]} include {search_seed}, on which the search picked "
                        f"its winners: use seed {search_seed} (seeds {search_seed + 1}..) or leave seed unset",
                        setting="seed")
    return seeds


def seed_block_base(block: int) -> int:
    """The base seed of seed block ``block`` (its seeds are base + 1 ... base + SEED_BLOCK_SIZE);
    UserError (naming ``seed_block``) for a block that is not a whole number >= 0."""
    if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block <= MAX_SEED_BLOCK:
        raise UserError(f"seed_block {block!r} must be a whole number in 0..{MAX_SEED_BLOCK} (a search seed, or a "
                        "unit's index)", setting="seed_block")
    return SEED_BLOCK_BASE + block * SEED_BLOCK_SIZE


def check_in_block(block: int, verdict: Iterable[int], tuning: Iterable[int] = ()) -> None:
    """UserError when the ``verdict`` seeds leave the first half of seed block ``block`` or the
    ``tuning`` seeds its second half (they would reach the next unit's, or each other's)."""
    base = seed_block_base(block)
    halves = ((verdict, base, base + TUNING_OFFSET, "verdict"),
              (tuning, base + TUNING_OFFSET, base + SEED_BLOCK_SIZE, "tuning"))
    for seeds, low, high, what in halves:
        outside = [s for s in seeds if not low < s <= high]
        if outside:
            raise UserError(f"{what} seed {outside[0]} lies outside seed block {block}'s {what} seeds "
                            f"({low + 1}..{high}): give fewer seeds (at most {TUNING_OFFSET} per block, the planned "
                            "ones of seeds auto included)", setting=("seed_block", "n_seeds", "max_seeds"))


def tuning_seeds(base_seed: int, n: int, *, verdict_seeds: Iterable[int] = (),
                 search_seed: int | None = None) -> list[int]:
    """The tuning seeds of a learning-rate grid: ``base_seed + 1001 ... base_seed + 1000 + n``;
    UserError for fewer than one, or a block that reaches a verdict seed or the search seed."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UserError(f"tuning_seeds {n!r}: give a positive number of tuning seeds per rate "
                        f"({DEFAULT_TUNING_SEEDS} is the default)", setting="tuning_seeds")
    seeds = list(range(int(base_seed) + TUNING_OFFSET + 1, int(base_seed) + TUNING_OFFSET + n + 1))
    shared = sorted(set(seeds) & set(verdict_seeds))
    if shared:
        raise UserError(f"the tuning seeds {seeds[0]}..{seeds[-1]} would share seed {shared[0]} with the seeds the "
                        f"verdict is measured on: give fewer seeds (at most {TUNING_OFFSET})",
                        setting=("tuning_seeds", "n_seeds"))
    if search_seed is not None and search_seed in seeds:
        raise UserError(f"the tuning seeds {seeds[0]}..{seeds[-1]} include {search_seed}, on which the search picked "
                        "its winners: use another seed", setting="seed")
    return seeds


def _check_fraction(value, name: str, high: float = 0.5, example: str = "0.01 (1%)") -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < high:
        raise UserError(f"{name} must be a fraction in (0, {high:g}) such as {example}, got {value!r}", setting=name)


@dataclass(frozen=True)
class SeedPlan:
    """Seeds from a target: plan the paired seeds that detect ``mde`` (relative on a log scale,
    else in the metric's units), at most ``max_seeds``."""

    mde: float
    max_seeds: int


# -- the setup ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StudySetup:
    """What a seed-based study trains with, built by ``resolve``. ``store`` (None: nothing cached or
    kept) and ``executor`` (None: a local one, made and closed per ``train``) are the caller's."""

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
    margin: float = DEFAULT_MARGIN  # the equivalence margin (relative on a log scale, else in units)
    power: float = DEFAULT_POWER  # the power that seed plans and minimal detectable effects aim at
    planned: "SeedPlan | None" = None  # seeds from a target: the study plans them from a pilot
    lr_grid: tuple[float, ...] = ()  # each gene at its best of these rates (studies.lr_grid); () : the config's
    tuning_seeds: tuple[int, ...] = ()  # the seeds that select a rate of lr_grid (never a verdict seed)
    match_params: bool = False  # each gene is judged against the baseline of its parameter count (nn.matching)
    seed_block: int | None = None  # the seeds come from this block (seed_block_base), not from config.seed

    @classmethod
    def resolve(cls, config, data, *, role: str, n_seeds: int = DEFAULT_SEEDS, min_seeds: int = 2,
                steps: int | None = None, eval_split: str = "valid", metric: str = "val_perplexity",
                confidence: float = 0.95, store: RunStore | None = None, executor: Executor | None = None,
                search_seed: int | None = None, source_run: str | os.PathLike | None = None, quiet: bool = True,
                seeds_setting: str = "n_seeds", margin: float = DEFAULT_MARGIN, power: float = DEFAULT_POWER,
                mde: float | None = None, max_seeds: int = DEFAULT_MAX_SEEDS,
                lr_grid: str | Sequence[float] | None = None,
                n_tuning_seeds: int = DEFAULT_TUNING_SEEDS, match_params: bool = False,
                seed_block: int | None = None) -> "StudySetup":
        """The setup of a study: seeds ``config.seed + 1 ... + n_seeds`` (at least ``min_seeds``, never
        ``search_seed``), ``steps`` (default ``config.train_steps``); UserError for a bad setting (the
        seed count named ``seeds_setting``) before anything is trained. ``n_seeds="auto"`` plans the
        seeds from a pilot for an effect of ``mde`` (``SeedPlan``). ``lr_grid`` (rates, or their text
        ``"5e-4,1e-3"``): each gene at its best rate, selected on ``n_tuning_seeds`` seeds of their own.
        ``match_params``: each verdict against the vanilla baseline widened to the gene's parameter count;
        not with a grid or planned seeds yet. ``seed_block`` K: every seed (verdict, pilot, planned,
        tuning) counted from block K's base (``seed_block_base``) instead of ``config.seed``, and in it."""
        stats.check_confidence(confidence)
        metric_info(metric, eval_split)
        if metric in ("bits_per_byte", "bits_per_char") and getattr(data, "scored_text", None) is not None \
                and data.scored_text(eval_split, 1, 1) is None:
            raise UserError(f"metric {metric} does not apply to the {getattr(data, 'name', 'given')} data: its tokens are "
                            "not text, so there are no bytes or characters to score; use val_perplexity, val_loss or "
                            "accuracy", setting="metric")
        _check_fraction(margin, "margin")
        _check_fraction(power, "power", high=1.0, example="0.8 (80%)")
        planned = None
        if n_seeds == "auto":
            if mde is None:
                raise UserError("seeds auto plans the seeds for a minimal detectable effect: give mde, e.g. 1%",
                                setting=(seeds_setting, "mde"))
            _check_fraction(mde, "mde")
            if isinstance(max_seeds, bool) or not isinstance(max_seeds, int) or max_seeds < 2:
                raise UserError(f"max_seeds must be an integer >= 2, got {max_seeds!r}", setting="max_seeds")
            planned = SeedPlan(float(mde), max_seeds)
            n_seeds = PILOT_SEEDS  # the pilot's; the plan replaces them
        if match_params and (planned is not None or lr_grid is not None or data is None):
            other = f"{seeds_setting} auto" if planned is not None else "lr_grid" if lr_grid is not None else "a suite"
            raise UserError(f"match_params cannot be combined with {other} yet: drop one of them",
                            setting=("match_params", seeds_setting if planned is not None else
                                     "lr_grid" if lr_grid is not None else "suite"))
        base = config.seed if seed_block is None else seed_block_base(seed_block)
        seeds = validation_seeds(base, n_seeds, search_seed, minimum=min_seeds, setting=seeds_setting)
        # every seed a verdict may use, the planned ones of seeds auto included
        reach = seeds + ([] if planned is None else list(range(seeds[-1] + 1, seeds[-1] + planned.max_seeds + 1)))
        rates, tuning = (), ()
        if lr_grid is not None:
            rates = parse_lr_grid(lr_grid)
            tuning = tuple(tuning_seeds(base, n_tuning_seeds, verdict_seeds=reach, search_seed=search_seed))
        if seed_block is not None:
            check_in_block(seed_block, reach, tuning)
        return cls(config=config, data=data, seeds=tuple(seeds),
                   steps=int(config.train_steps if steps is None else steps), role=role, eval_split=eval_split,
                   metric=metric, confidence=confidence, search_seed=search_seed,
                   source_run=None if source_run is None else str(source_run), store=store, executor=executor,
                   quiet=quiet, margin=float(margin), power=float(power), planned=planned, lr_grid=rates,
                   tuning_seeds=tuning, match_params=bool(match_params), seed_block=seed_block)

    @property
    def base_seed(self) -> int:
        """The seed the study's seeds count from: its block's base, else the config's seed."""
        return self.config.seed if self.seed_block is None else seed_block_base(self.seed_block)

    def at(self, config) -> "StudySetup":
        """This setup with another config (a rung of a ladder), trained for its ``train_steps``."""
        return dataclasses.replace(self, config=config, steps=int(config.train_steps))

    def at_rate(self, rate: float) -> "StudySetup":
        """This setup with the config's learning rate set to ``rate`` (its steps unchanged): the
        trainings of one point of a learning-rate grid, or of a gene at its selected rate."""
        return dataclasses.replace(self, config=self.config.replace(learning_rate=float(rate)))

    # -- what the metric reads as --------------------------------------------------------------
    @property
    def metric_label(self) -> str:
        return metric_info(self.metric, self.eval_split)[0]

    @property
    def lower_is_better(self) -> bool:
        return metric_info(self.metric, self.eval_split)[1]

    @property
    def log_scale(self) -> bool:
        """Whether the metric is compared on the log scale (a ratio metric: differences are relative)."""
        return self.metric in stats.LOG_SCALE_METRICS

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    # -- the paired comparison with the baseline ----------------------------------------------------
    def versus(self, values: Mapping[str, Sequence], reference: Sequence,
               others: Mapping[str, dict] | None = None) -> dict[str, dict]:
        """``stats.versus_reference`` at this setup's confidence, scale, margin, direction and power,
        Holm's correction over ``values`` and ``others``."""
        return stats.versus_reference(values, reference, confidence=self.confidence, log=self.log_scale,
                                      margin=self.margin, lower_is_better=self.lower_is_better, power=self.power,
                                      others=others)

    def versus_baseline(self, values: Mapping[str, Sequence], baseline: Sequence) -> dict[str, dict]:
        """Each gene's per-seed values (aligned with ``self.seeds``) against the baseline's
        (``versus``), Holm's correction over the whole family of comparisons that share these
        baseline trainings in the store (``others``)."""
        return self.versus(values, baseline, self.others(values))

    def versus_baselines(self, values: Mapping[str, Sequence], references: Mapping[str, Sequence],
                         setups: Mapping[str, "StudySetup"], genes: Iterable[str] = (),
                         others: Mapping[str, dict] | None = None) -> dict[str, dict]:
        """Each gene's per-seed values against its own baseline (``references[gene]``, trained by
        ``setups[gene]``: a matched baseline), Holm's correction over one family: every comparison
        here plus the comparisons the store holds against each of these baselines' trainings (but
        those of ``genes``: the gene keys behind names that are not keys), and ``others`` (name ->
        values and reference: comparisons of the same study made elsewhere, a ladder's other sizes)."""
        stored: dict[str, dict] = dict(others or {})
        for setup in {id(s): s for s in setups.values()}.values():
            for gene, other in setup.others([*values, *genes]).items():
                stored[f"{gene} @ FFN {setup.config.ffn_dim}"] = other
        out = {}
        for key, sample in values.items():
            family = {**{k: {"values": values[k], "reference": references[k]} for k in values if k != key}, **stored}
            out[key] = self.versus({key: sample}, references[key], family)[key]
        return out

    def family_size(self, genes: Sequence[str], n_seeds: int | None = None) -> int:
        """The size of Holm's family in which ``genes`` meet the baseline on these seeds (or on the first
        ``n_seeds`` from the base): the genes and the comparisons the store holds against the same baseline
        trainings (``others``; against each matched baseline's with ``match_params``), as the verdicts correct
        over them; a learning-rate grid's at the configured rate; without data (a suite), the genes alone."""
        if n_seeds is not None:
            return dataclasses.replace(self, seeds=tuple(range(self.base_seed + 1, self.base_seed + n_seeds + 1))
                                       ).family_size(genes)
        if self.data is None:
            return len(genes)
        setups = ({m["ffn_dim"]: self.with_ffn(m["d_ff"]) for m in self.matched_baselines(genes).values()}.values()
                  if self.match_params else [self])
        return len(genes) + sum(len(setup.others(genes)) for setup in setups)

    def matched_baselines(self, genes: Iterable[str], reference=None) -> dict[str, dict]:
        """By gene key: the study's baseline (or the ``reference`` genome) matched to its parameter
        count at this setup's model and data (``nn.matching.matched_baseline``: ``d_ff``,
        ``params``, ``candidate_params``, ...)."""
        from evo_attention.nn.matching import matched_baseline

        spec = self.config.model.with_data(self.data.vocab_size, self.data.seq_len)
        reference = self.baseline if reference is None else reference
        return {key: matched_baseline(spec, key, reference) for key in genes}

    @property
    def baseline(self) -> str:
        """The key of the baseline gene this study compares against (``Config.resolved_baseline``: the
        vanilla transformer, without attention dropout on a generated task)."""
        return self.config.resolved_baseline().key

    def with_ffn(self, d_ff: int | None) -> "StudySetup":
        """This setup with the model's feed-forward width ``d_ff`` (a matched baseline's trainings)."""
        return dataclasses.replace(self, config=self.config.replace(d_ff=d_ff))

    def others(self, genes: Iterable[str]) -> dict[str, dict]:
        """The other comparisons against this study's baseline trainings, by gene: every gene not in
        ``genes`` that the store holds for all of the baseline's seeds under the same settings, data,
        steps and split, with its per-seed values and the baseline's, from the stored records."""
        if self.store is None:
            return {}
        base_key, skip = self.baseline, set(genes)
        keys = {seed: Trial.from_config(base_key, self.config, seed=seed, steps=self.steps, eval_split=self.eval_split,
                                        data=self.data).key()[2:]  # (steps, fingerprint, context) per seed
                for seed in self.seeds}
        found: dict[str, dict[int, Any]] = {}
        baseline: dict[int, Any] = {}
        for record in self.store.evaluations():
            seed = record.get("seed")
            if seed not in keys or (int(record["steps"]), record["data_fingerprint"], record["context"]) != keys[seed]:
                continue
            value = usable_metric(record, self.metric)
            if record.get("gene") == base_key:
                baseline[seed] = value
            elif record.get("gene") not in skip:
                found.setdefault(record["gene"], {})[seed] = value
        if set(baseline) != set(self.seeds):
            return {}
        reference = [baseline[s] for s in self.seeds]
        return {gene: {"values": [by_seed[s] for s in self.seeds], "reference": reference}
                for gene, by_seed in sorted(found.items()) if set(by_seed) == set(self.seeds)}

    # -- training -------------------------------------------------------------------------------
    def tasks(self, genes: Iterable[AttentionGene | str], labels: Mapping[str, str] | None = None) -> list[EvalTask]:
        """One task per distinct gene and seed (genes in the given order, then seeds); ``labels``
        (gene key -> name) names them in progress lines, else ``seed N``."""
        labels = labels or {}
        return [EvalTask(Trial.from_config(key, self.config, seed=seed, steps=self.steps, eval_split=self.eval_split,
                                           data=self.data),
                         role=self.role, label=f"{labels[key]}, seed {seed}" if key in labels else f"seed {seed}")
                for key in gene_keys(genes) for seed in self.seeds]

    def train(self, genes: Iterable[AttentionGene | str], *, labels: Mapping[str, str] | None = None,
              on_finished: FinishedFn | None = None) -> Records:
        """The record of every (gene, seed): from the store when there, else trained and stored at
        once. ``on_finished(task, record, cached)`` sees each as it comes (an interrupted study
        keeps what finished through it)."""
        records = self.run(self.tasks(genes, labels), on_finished=on_finished)
        return {(task.gene, task.seed): record for task, record in records.items()}

    def run(self, tasks: Sequence[EvalTask], *, on_finished: FinishedFn | None = None,
            datasets: Mapping | None = None) -> dict[EvalTask, EvaluationRecord]:
        """The record of every task (of this setup's data, or of ``datasets``: task spec -> its dataset;
        their trials may differ in anything else), as ``train`` gets them, in one call of the runner."""
        context = executor_for(self.config) if self.executor is None else nullcontext(self.executor)
        known = {**({self.config.task: self.data} if self.data is not None else {}), **(datasets or {})}
        with context as executor, SearchView(len(tasks), enabled=not self.quiet) as view:
            runner = Runner(executor, store=self.store, data=known, view=view, activity=f"{self.role}:",
                            on_finished=on_finished)
            return runner.evaluate(list(tasks))

    # -- provenance -----------------------------------------------------------------------------
    def provenance(self, steps: int | Sequence[int] | None = None) -> dict:
        """The settings block every study result carries (enough to reproduce it); ``steps``
        replaces the setup's own (a ladder gives one per rung)."""
        from evo_attention.train.environment import machine, versions

        import matplotlib
        import numpy
        import scipy

        return {
            "metric": self.metric, "metric_label": self.metric_label, "lower_is_better": self.lower_is_better,
            "eval_split": self.eval_split, "confidence": self.confidence, "seeds": list(self.seeds),
            "test": stats.paired_test_name(self.log_scale), "margin": self.margin, "power": self.power,
            "search_seed": self.search_seed, "steps": self.steps if steps is None else steps,
            **({} if self.seed_block is None else {"seed_block": {
                "block": self.seed_block, "first": self.base_seed + 1, "last": self.base_seed + SEED_BLOCK_SIZE,
                "rule": "each unit (search) draws its seeds from a block of its own: no seed serves two units"}}),
            "source_run": self.source_run,
            "created_at": utc_now(),
            "config": self.config.to_dict(), "data": None if self.data is None else self.data.describe(),
            "versions": {**versions(), "numpy": numpy.__version__, "scipy": scipy.__version__,
                         "matplotlib": matplotlib.__version__},
            "machine": machine(),
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
    """The run store that keeps a study's trainings in ``directory``, held by this process alone (the
    directory's lock, ``search.lock``, released when the store closes): the one there if an earlier
    ``study`` of the same kind wrote it, else a new one holding ``config`` as its configuration. A
    store of another kind (a search's, another study's) is refused, as is a directory another process
    writes."""
    lock = RunLock(directory).acquire()
    try:
        if not RunStore.exists(directory):
            return RunStore.create(directory, config=config.to_dict(), meta={STUDY: study}).hold(lock)
        store = RunStore.open(directory)
        try:
            store.check_kind(study)
        except UserError:
            store.close()
            raise
        return store.hold(lock)
    except BaseException:
        lock.release()
        raise


@contextmanager
def study_resources(config, executor: Executor | str, store: RunStore | None, out_dir: str | os.PathLike | None,
                    study: str) -> Iterator[tuple[Executor, RunStore | None]]:
    """The executor and the run store a study trains with, closed when it ends unless they are the
    caller's: ``executor`` (an Executor, left open, or a name for ``executor_for``) and ``store``
    (left open), else the store of ``study`` in ``out_dir`` (``study_store``; None without one)."""
    with ExitStack() as stack:
        if not isinstance(executor, Executor):
            executor = stack.enter_context(executor_for(config, executor))
        if store is None and out_dir is not None:
            store = stack.enter_context(study_store(out_dir, config, study))
        yield executor, store


# -- the result -----------------------------------------------------------------------------------
class StudyResult(Mapping):
    """A study's result: typed fields (in subclasses), read also as the mapping of ``to_dict()``, the
    JSON-able dict the study writes (keys in the order written), computed once: a result is a value."""

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

    seeds = property(lambda self: list(self.provenance["seeds"]))
    metric = property(lambda self: self.provenance["metric"])
    eval_split = property(lambda self: self.provenance["eval_split"])
    confidence = property(lambda self: self.provenance["confidence"])


def written(key: str) -> property:
    """A result's property that reads ``key`` of what it writes (``result.genes`` is ``result["genes"]``)."""
    return property(lambda self: self[key])


class VerdictResult(SeedStudyResult):
    """A seed study whose result is the baseline's row, a row per gene with its verdict, and a headline."""

    baseline = written("baseline")
    genes = written("genes")
    headline = written("headline")


# -- per-gene samples -----------------------------------------------------------------------------
# what a gene costs, beside its quality: the record's cost objectives (all minimised)
# (not peak memory: on a CPU it is the worker process's high-water mark over every training it ran)
COSTS = ("params", "flops", "train_ms_per_step", "latency_ms")


def trained_as(records) -> dict[str, int]:
    """How many of ``records`` trained on each device in each precision (``"cpu bf16": 28``), as the
    records say: what a result file keeps of ``precision auto``'s per-machine choice once its store is
    gone."""
    counts = Counter(f"{r['device']} {r['precision']}" if r.get("device") and r.get("precision") else "unrecorded"
                     for r in records)
    return dict(sorted(counts.items()))


def samples(records: Mapping[tuple[str, int], Mapping], key: str, seeds: Sequence[int], metric: str) -> dict:
    """One gene's ``seeds``, per-seed ``values`` (None where failed), ``statuses``, ``devices`` and
    ``precisions`` (as its records say), ``n_failed``, ``errors`` (a line per failed seed), ``cost`` (each
    of ``COSTS``, the median over the finished trainings: it damps one slow neighbour), ``scored``'s fields."""
    rows = [records[key, s] for s in seeds]
    values = [usable_metric(r, metric) for r in rows]
    errors = [f"seed {s}: {r.get('error') or r.get('status')}" for s, r, v in zip(seeds, rows, values) if v is None]
    cost = {}
    for name in COSTS:
        measured = [v for v in (objective_value(r, name) for r in rows) if v is not None]
        cost[name] = statistics.median(measured) if measured else None
    return {"seeds": list(seeds), "values": values, "statuses": [str(r.get("status")) for r in rows],
            "devices": [r.get("device") for r in rows], "precisions": [r.get("precision") for r in rows],
            "n_failed": sum(v is None for v in values), "errors": errors, "cost": cost, **scored(rows, values)}


def scored(rows: Sequence[Mapping], values: Sequence) -> dict:
    """``eval_tokens``: the tokens each finished training's value was scored on (one count where all
    agree, else one per seed, None where failed); ``eval_complete``: whether every one scored its whole
    split (False: eval_steps cut an evaluation short; None: unknown, no finished training or an old record)."""
    tokens = [r.get("eval_tokens") if v is not None else None for r, v in zip(rows, values)]
    complete = [r.get("eval_complete") for r, v in zip(rows, values) if v is not None]
    known = set(t for t in tokens if t is not None)
    return {"eval_tokens": known.pop() if len(known) == 1 and None not in tokens else tokens,
            "eval_complete": False if False in complete else None if not complete or None in complete else True}


def write_files(out_dir: str | os.PathLike, names: Mapping[str, str], result: Mapping,
                markdown: str) -> dict[str, Path]:
    """Write ``result`` as JSON and its ``markdown`` into ``out_dir`` (created), under the first and
    the second of ``names`` (key -> file name; any further one, e.g. the caller's figure, is left to
    the caller); returns key -> path."""
    out = output_dir(out_dir)
    paths = {key: out / name for key, name in names.items()}
    json_key, md_key = list(names)[:2]
    write_json(paths[json_key], result)
    write_text(paths[md_key], markdown)
    return paths


def write_json_and_markdown(kind: str, result: Mapping, out_dir: str | os.PathLike, markdown: str) -> dict[str, Path]:
    """Write ``KIND.json`` and ``KIND.md`` (``KIND_test.*`` for the test split) into ``out_dir``;
    returns their paths and the path the caller's figure goes to (``png``)."""
    stem = output_stem(kind, result.get("eval_split", "valid"))
    return write_files(out_dir, {"json": f"{stem}.json", "md": f"{stem}.md", "png": f"{stem}.png"}, result, markdown)
