"""The ask/tell interface every search strategy implements, and how results are ranked.

A strategy only proposes genes and learns their fitness; it never trains anything::

    strategy = make_strategy("ga", seed=42)
    while not strategy.done:
        genes = strategy.ask()                      # the genes that need a fitness now
        strategy.tell([(g, train(g)) for g in genes])

Fitness is validation perplexity, lower is better; with several ``objectives`` (perplexity first,
then costs, all minimised) one tuple per gene. ``None``, NaN and infinities mean "failed" and rank
last. ``tell`` may also give each gene's excess over the run's caps (``search.constraints``): a
gene with a positive total violation ranks after every feasible one (``rank_members``).

Determinism: a strategy draws every random number from its own ``random.Random(seed)``, so a fresh
strategy with the same seed, told the stored results generation by generation, proposes exactly
what an interrupted one would have: a run is resumed by replaying.
"""

from __future__ import annotations

import itertools
import math
import operator
import random
from abc import ABC, abstractmethod
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Mapping, Sequence

from evo_attention.util.errors import UserError
from evo_attention import programs
from evo_attention.genes import (ALL_FIELDS, CORE_FIELDS, AttentionGene, LayerGenes, SearchSpace, canonical_program,
                                 in_program_form, program_grammar, violation)
from evo_attention.search.constraints import violation as total_violation
from evo_attention.search.pareto import pareto_order
from evo_attention.search.warm_start import outside_space
from evo_attention.train.config import CAP_FIELDS, as_bool

# A draw that repeats a key is redrawn this many times before the remaining keys are enumerated.
_REDRAW_TRIES = 64


# -- ranking --------------------------------------------------------------------------------------
def fitness_value(value: Any) -> float:
    """A told fitness as a float: ``inf`` for a failure (None, NaN, +-inf)."""
    if value is None:
        return math.inf
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"fitness must be a number or None, got {value!r}") from None
    return number if math.isfinite(number) else math.inf


def ranking_key(gene: AttentionGene | str, fitness: Any) -> tuple:
    """Sort key: finite fitness ascending, then failures; ties broken by the gene key."""
    key = gene.key if isinstance(gene, AttentionGene) else str(gene)
    value = fitness_value(fitness)
    return (1, 0.0, key) if math.isinf(value) else (0, value, key)


def objective_vector(value: Any, n: int) -> tuple[float, ...]:
    """A told multi-objective fitness as a tuple of ``n`` floats: ``inf`` everywhere for a failure
    (None, or a non-finite first value), ``inf`` in the place of any other non-finite value."""
    if value is None:
        return (math.inf,) * n
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"a fitness of {n} objectives must be a sequence of {n} numbers or None, got {value!r}")
    if len(value) != n:
        raise TypeError(f"a fitness of {n} objectives must have {n} values, got {len(value)}: {value!r}")
    values = tuple(fitness_value(v) for v in value)
    return (math.inf,) * n if math.isinf(values[0]) else values


@dataclass(frozen=True)
class Individual:
    """One evaluated member of a population: ``fitness`` is -perplexity (higher is better, -inf if
    failed).

    ``perplexity`` is what the strategy was told (``inf`` when training failed); ``generation`` is
    the generation in which the gene was first evaluated in this run; ``is_elite`` is True for a
    member carried over unchanged from the previous generation (it was not evaluated again).
    A search driver also attaches the training's ``record``, ``train_loss``, ``status`` and
    ``steps`` (the budget the result was measured at: below the run's budget for an individual
    stopped early by a multi-fidelity schedule). ``objectives`` is the told objective vector of a
    multi-objective search (empty for a single objective); ``values`` gives the vector in both cases.
    ``violation`` is the gene's total violation of the run's caps (0: feasible; see ``tell``).
    """

    gene: AttentionGene
    perplexity: float
    generation: int = 0
    is_elite: bool = False
    train_loss: float = float("nan")
    status: str = "ok"
    steps: int | None = None
    record: Any = field(default=None, repr=False, compare=False)
    objectives: tuple = ()
    violation: float = 0.0

    @property
    def feasible(self) -> bool:
        return not self.violation > 0

    @property
    def values(self) -> tuple:
        return self.objectives or (self.perplexity,)

    @property
    def failed(self) -> bool:
        return math.isinf(self.perplexity)

    @property
    def fitness(self) -> float:
        return 0.0 - self.perplexity if math.isfinite(self.perplexity) else float("-inf")  # never -0.0

    def to_dict(self) -> dict:
        out = {"gene": self.gene.key, "perplexity": self.perplexity, "fitness": self.fitness,
               "train_loss": self.train_loss, "generation": self.generation, "status": str(self.status),
               "is_elite": self.is_elite, "steps": self.steps}
        if len(self.objectives) > 1:
            out["objectives"] = list(self.objectives)
        if not self.feasible:
            out["violation"] = self.violation
        return out


def rank_members(members: Iterable[Individual]) -> list[Individual]:
    """Individuals best first; elites before equal newcomers (stable sort).

    One objective: by ``ranking_key``. Several: by Pareto front, then crowding distance (larger
    first), then ``ranking_key`` (``search.pareto.pareto_order``); failures last. Infeasible
    members (a positive ``violation``) come after every feasible one, by violation, then
    ``ranking_key``.
    """
    members = list(members)
    infeasible = [m for m in members if not m.feasible]
    if infeasible:
        feasible = [m for m in members if m.feasible]
        return rank_members(feasible) + sorted(infeasible, key=lambda m: (m.violation,
                                                                           ranking_key(m.gene, m.perplexity)))
    if not any(len(m.objectives) > 1 for m in members):
        return sorted(members, key=lambda m: ranking_key(m.gene, m.perplexity))
    order = pareto_order([m.values for m in members], [ranking_key(m.gene, m.perplexity) for m in members])
    return [members[i] for i in order]


def best_member(members: Iterable[Individual]) -> Individual | None:
    """The feasible member with the lowest perplexity (ties: the first in ``members``); without a
    feasible member, the member with the lowest perplexity; None if empty."""
    return min(members, key=lambda m: (not m.feasible, ranking_key(m.gene, m.perplexity)), default=None)


# -- drawing genes ----------------------------------------------------------------------------
def enumerate_space(space: SearchSpace) -> list[AttentionGene]:
    """Every distinct valid gene of ``space``, in a fixed order (a per-layer space is not
    enumerated: [] — it is too large to be exhausted)."""
    if space.layers:
        return []
    genes: dict[str, AttentionGene] = {}
    for combo in itertools.product(*(space.options(name) for name in ALL_FIELDS)):
        values = dict(zip(ALL_FIELDS, combo))
        if violation(values) is None:
            gene = AttentionGene(gene_dict=values)
            genes.setdefault(gene.key, gene)
    return list(genes.values())


NEIGHBOUR_TRIES = 20  # draws per wanted neighbour before random genes fill generation 0


def neighbour(gene: AttentionGene, rng: random.Random, space: SearchSpace) -> AttentionGene:
    """One edit of ``gene``: one field that the space varies set to another of its options, or in a
    program space (a classic gene in its program form) its program edited once (``programs.edit``),
    the program weighing as much as its edit weights sum to and every other varied field (a rate
    axis, ``learning_rate: [...]``, say) as 1; ``gene`` itself when no edit applies."""
    programs_space = space.program_space
    if programs_space is not None:
        gene = AttentionGene.parse(in_program_form(gene.key, space))
    values = gene.to_dict()
    names = [n for n in ALL_FIELDS if n != "program" and not (programs_space is not None and n in CORE_FIELDS)
             and [o for o in space.options(n) if o != values[n]]]
    program_weight = sum(w for _, w in programs_space.edits) if programs_space is not None else 0
    for _ in range(NEIGHBOUR_TRIES if names or program_weight else 0):
        if program_weight and rng.random() * (program_weight + len(names)) < program_weight:
            child = programs.mutate(canonical_program(gene.program), rng, programs_space, program_grammar())
            return gene.replace(program=child.text)
        name = rng.choice(names)
        changed = {**values, name: rng.choice([o for o in space.options(name) if o != values[name]])}
        if violation(changed) is None:
            return AttentionGene(gene_dict=changed)
    return gene


def draw_new_gene(rng: random.Random, space: SearchSpace, exclude: set[str]) -> AttentionGene:
    """A gene drawn uniformly from the genes of ``space`` whose key is not in ``exclude``.

    Redraws a repeated key a few times; if that keeps failing (a nearly exhausted space) it picks
    uniformly among the remaining genes; if none remain it returns a repeat.
    """
    for _ in range(1 + _REDRAW_TRIES):
        gene = space.random(rng)
        if gene.key not in exclude:
            return gene
    remaining = [g for g in enumerate_space(space) if g.key not in exclude]
    return rng.choice(remaining) if remaining else gene


# -- the interface ------------------------------------------------------------------------------
def _as_int(name: str, value: Any, minimum: int) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise UserError(f"{name} {value!r} is not an integer: use a whole number >= {minimum}") from None
    if number < minimum:
        raise UserError(f"{name} {number} is too small: use a whole number >= {minimum}")
    return number


def as_rate(name: str, value: Any) -> float:
    """A strategy's probability setting ``name`` as a float in [0, 1] (else a UserError naming it)."""
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{name} {value!r} is not a number: use a probability in [0, 1]") from None
    if not 0.0 <= rate <= 1.0:
        raise UserError(f"{name} {value!r} is outside [0, 1]: use a probability in [0, 1]")
    return rate


class Strategy(ABC):
    """Base of the search strategies: ask for genes, tell their fitness, repeat until ``done``.

    Attributes kept up to date after every ``tell``:

    - ``generation``: index of the generation being asked/told (0-based); ``n_generations``
      once done.
    - ``done``: True after ``n_generations`` generations have been told.
    - ``population``: the current population as ``Individual`` s, best first (``rank_members``).
    - ``history``: one dict per told generation with ``generation``, ``best_perplexity``,
      ``best_gene`` (key), ``mean_perplexity`` (over the finite perplexities of ``members``;
      NaN if none), ``members`` (``[(key, perplexity)]`` best first) and ``n_evaluated``.

    Every strategy asks in batches of the same sizes (``population_size`` in generation 0, then
    ``population_size - elite_size``, for ``n_generations`` generations), so strategies compared at
    one config spend the same budget. ``constraints`` names the caps of the run (``max_params``,
    ...; empty without any): ``tell`` is then given each gene's excess over them. Subclasses set
    ``name``, take their own settings as keyword arguments, name the Config fields they read in
    ``CONFIG_FIELDS`` and the keys of ``strategy_options`` they accept in ``OPTIONS`` (with
    defaults), and implement ``_propose`` (the genes of the current generation) and ``_update``
    (fold the told results into ``population``). ``register_strategy`` makes one known by name.
    """

    name: ClassVar[str] = ""
    # the seeded start the driver gives it when ``start_from`` names none (None: random draws)
    default_start: ClassVar[str | None] = None
    CONFIG_FIELDS: ClassVar[tuple[str, ...]] = ("population_size", "n_generations", "elite_size", "seed", "objectives")
    OPTIONS: ClassVar[dict[str, Any]] = {"seed_vanilla": False}

    def __init__(self, *, population_size: int = 12, n_generations: int = 10, elite_size: int = 3, seed: int = 42,
                 space: SearchSpace | Mapping | None = None, seed_vanilla: bool = False,
                 objectives: Sequence[str] = ("perplexity",), constraints: Sequence[str] = (),
                 vanilla: AttentionGene | None = None):
        self.population_size = _as_int("population_size", population_size, 1)
        self.n_generations = _as_int("n_generations", n_generations, 1)
        self.elite_size = _as_int("elite_size", elite_size, 0)
        if self.elite_size >= self.population_size:
            raise UserError(
                f"elite_size {self.elite_size} must be smaller than population_size "
                f"{self.population_size}: lower elite_size or raise population_size",
                setting=("elite_size", "population_size"))
        self.seed = _as_int("seed", seed, -(2**63))
        if space is None:
            space = SearchSpace()
        elif isinstance(space, Mapping):
            space = SearchSpace.from_dict(space)
        elif not isinstance(space, SearchSpace):
            raise UserError(f"space {space!r} is not a search space: pass a SearchSpace or a dict of options")
        self.space = space
        if self.default_start is not None and space.layers:  # its start and every edit are one shared gene
            raise UserError(f"{self.name} edits one gene shared by every layer, not a per-layer genome: use genome "
                            "shared, or strategy ga or random (they draw whole genomes)",
                            setting=("strategy", "genome"))
        self.seed_vanilla = as_bool("seed_vanilla", seed_vanilla)
        # the gene seed_vanilla seeds: the config's (Config.vanilla_gene, the baseline's training), else the space's
        self.vanilla = space.vanilla() if vanilla is None else (
            LayerGenes([vanilla] * space.layers) if space.layers and isinstance(vanilla, AttentionGene) else vanilla)
        program_form = in_program_form(self.vanilla.key, space) if self.seed_vanilla else None
        if program_form is not None and (reason := outside_space(program_form, space)) is not None:
            raise UserError(f"seed_vanilla: the vanilla gene {program_form} is outside this run's search space: "
                            f"{reason}; drop seed_vanilla or widen the space", setting=("seed_vanilla", "search_space"))
        if isinstance(objectives, str) or not objectives or not all(isinstance(o, str) for o in objectives):
            raise UserError(f"objectives {objectives!r} must be a non-empty list of objective names",
                            setting="objectives")
        self.objectives = tuple(objectives)
        if isinstance(constraints, str) or not all(isinstance(c, str) for c in constraints):
            raise UserError(f"constraints {constraints!r} must be a list of cap names such as max_params",
                            setting="constraints")
        self.constraints = tuple(constraints)

        self.rng = random.Random(self.seed)
        self.generation = 0
        self.done = False
        self.population: list[Individual] = []
        self.history: list[dict] = []
        self._pending: list[AttentionGene] | None = None
        self._asked_keys: set[str] = set()
        self._first_generation: dict[str, int] = {}
        self._warm: list = []  # warm_start genes: the first of generation 0
        self._neighbours = False  # whether one-edit neighbours of the warm genes fill generation 0
        self._excess: dict[str, dict] = {}  # gene key -> its told excess over each cap

    @classmethod
    def from_config(cls, config) -> "Strategy":
        """The strategy a Config describes: its ``CONFIG_FIELDS``, ``strategy_options`` and space."""
        options = dict(config.strategy_options)
        for key in options:
            if key not in cls.OPTIONS:
                valid = ", ".join(sorted(cls.OPTIONS)) or "none"
                raise UserError(f"unknown strategy_options key {key!r} for strategy {cls.name!r}: valid keys are {valid}",
                                setting=(key, *cls.OPTIONS))
        settings = {name: getattr(config, name) for name in cls.CONFIG_FIELDS}
        if len(config.objectives) > 1:  # a strategy that names its own CONFIG_FIELDS is told vectors all the same
            settings["objectives"] = config.objectives
        caps = [name for name in CAP_FIELDS if getattr(config, name, None) is not None]
        if caps:  # only a constrained run names them, so a strategy of one's own needs no such keyword otherwise
            settings["constraints"] = caps
        if options.get("seed_vanilla"):  # this config's vanilla gene (without attention dropout on a generated task)
            settings["vanilla"] = config.vanilla_gene()
        return cls(**settings, **options, space=config.space())

    # -- the protocol ---------------------------------------------------------------------------
    def ask(self) -> list[AttentionGene]:
        """The new genes of the current generation that need a fitness; ``[]`` once done.

        Asking again before ``tell`` returns the same genes (no random numbers are drawn twice).
        """
        if self.done:
            return []
        if self._pending is None:
            self._pending = list(self._propose())
            self._asked_keys.update(g.key for g in self._pending)
        return list(self._pending)

    def tell(self, results: Sequence[tuple[AttentionGene | str, Any]] | Mapping,
             violations: Mapping | None = None) -> None:
        """Report the fitness (perplexity) of exactly the genes of the last ``ask``, in any order.

        ``results`` is a sequence of ``(gene or key, fitness)`` pairs or a mapping gene -> fitness.
        A gene asked several times may be told once (the value applies to every copy) or once per
        copy. None/NaN/inf mean failed. With several ``objectives`` each fitness is a tuple of
        their values (or None); subclasses then receive it as a tuple of floats.

        ``violations`` (a constrained run): gene or key -> its excess over each cap (``{cap:
        value / limit - 1}``, positive where broken) or its total violation as one number; a gene
        it leaves out is feasible. Infeasible genes rank after the feasible ones (``rank_members``).
        """
        if self.done:
            raise RuntimeError(f"strategy {self.name!r} is done: all {self.n_generations} generations were told")
        asked = self.ask()
        told = self._match(asked, results)
        for gene, value in (violations or {}).items():
            key = AttentionGene.parse(gene).key
            self._excess[key] = dict(value) if isinstance(value, Mapping) else {"total": float(value)}
        for gene, _ in told:
            self._first_generation.setdefault(gene.key, self.generation)
        self._update(told)
        members = self._history_members(told)
        finite = [m.perplexity for m in members if not m.failed]
        best = self.best
        self.history.append({
            "generation": self.generation,
            "best_perplexity": best.perplexity,
            "mean_perplexity": sum(finite) / len(finite) if finite else math.nan,
            "best_gene": best.gene.key,
            "members": [(m.gene.key, m.perplexity) for m in members],
            "n_evaluated": len(told),
        })
        self._pending = None
        self.generation += 1
        self.done = self.generation >= self.n_generations

    # -- queries --------------------------------------------------------------------------------
    def batch_size(self, generation: int) -> int:
        """How many genes generation ``generation`` asks for."""
        return self.population_size if generation == 0 else self.population_size - self.elite_size

    def total_evaluations(self) -> int:
        """Planned number of fitness requests over the whole run (12/10/3 -> 93)."""
        return sum(self.batch_size(g) for g in range(self.n_generations))

    @property
    def n_objectives(self) -> int:
        return len(self.objectives)

    @property
    def elite_places(self) -> int:
        """How many of the best members this strategy builds on (what racing re-measures first)."""
        return max(1, self.elite_size)

    @property
    def best(self) -> Individual | None:
        """The member with the lowest perplexity so far (None before the first ``tell``); with one
        objective that is ``population[0]``."""
        return best_member(self.population)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(population_size={self.population_size}, "
                f"n_generations={self.n_generations}, elite_size={self.elite_size}, seed={self.seed}, "
                f"generation={self.generation}, done={self.done})")

    # -- for subclasses -------------------------------------------------------------------------
    @abstractmethod
    def _propose(self) -> list[AttentionGene]:
        """The genes of generation ``self.generation`` (called once per generation)."""

    @abstractmethod
    def _update(self, told: list[tuple[AttentionGene, float]]) -> None:
        """Fold the told ``(gene, fitness)`` pairs (in asked order) into ``population``."""

    def _history_members(self, told: list[tuple[AttentionGene, float]]) -> list[Individual]:
        """The members a history entry lists (default: the population)."""
        return self.population

    def _member(self, gene: AttentionGene, fitness: float | tuple, is_elite: bool = False) -> Individual:
        """A new ``Individual`` of a told ``fitness`` (a float, or a tuple with several objectives),
        with its told violation of the run's caps (a plugin strategy's helper: docs/extending.md)."""
        objectives = fitness if isinstance(fitness, tuple) else ()
        generation = self._first_generation.get(gene.key, self.generation)
        return Individual(gene, fitness[0] if objectives else fitness, generation, is_elite, objectives=objectives,
                          violation=total_violation(self._excess.get(gene.key)))

    def excess_of(self, gene: AttentionGene | str) -> dict:
        """The told excess of ``gene`` over each cap (``{}``: feasible, or nothing told)."""
        key = gene.key if isinstance(gene, (AttentionGene, LayerGenes)) else str(gene)
        return dict(self._excess.get(key) or {})

    def warm_start(self, genes: Iterable[AttentionGene | LayerGenes], *, neighbours: bool = False) -> None:
        """Start generation 0 with ``genes`` (at most ``population_size``, repeats dropped) before
        random draws fill the rest (``_initial_genes``); with ``neighbours`` (a seeded start), the
        rest are one-edit neighbours of them instead (``neighbour``). Call it before the first ``ask``."""
        if self.generation > 0 or self._pending is not None:
            raise RuntimeError("warm_start must come before the first ask")
        unique: dict[str, Any] = {}
        for gene in genes:
            unique.setdefault(gene.key, gene)
        self._warm = list(unique.values())[: self.population_size]
        self._neighbours = bool(neighbours)

    def _told_value(self, fitness: Any) -> float | tuple:
        """A told fitness in the form the subclasses receive: a float for one objective, a tuple
        of floats for several."""
        if self.n_objectives == 1:
            if isinstance(fitness, Sequence) and not isinstance(fitness, (str, bytes)) and len(fitness) == 1:
                fitness = fitness[0]
            return fitness_value(fitness)
        return objective_vector(fitness, self.n_objectives)

    def _initial_genes(self, exclude: set[str] = frozenset()) -> list[AttentionGene]:
        """``population_size`` distinct genes: the ``warm_start`` genes first, then random draws; with option
        ``seed_vanilla`` the vanilla transformer (refused at construction when it is outside the space, as
        ``start_from vanilla`` is) replaces the last of them (unless it is among them anyway)."""
        genes = [g for g in self._warm if g.key not in exclude]
        taken = set(exclude) | {g.key for g in genes}
        starts = [g for g in genes if isinstance(g, AttentionGene)] if self._neighbours else []
        if starts:
            self._add_neighbours(genes, taken, self.population_size,
                                 lambda i: neighbour(starts[i % len(starts)], self.rng, self.space))
        self._add_draws(genes, taken, self.population_size)
        if self.seed_vanilla and self.vanilla not in genes:
            genes = [self.vanilla] + genes[:-1]
        return genes

    def _add_neighbours(self, genes: list, taken: set[str], size: int, edit) -> list[AttentionGene]:
        """``genes`` filled up to ``size`` with the one-edit neighbours ``edit(i)`` (the i-th try) whose
        keys are not ``taken``, in ``NEIGHBOUR_TRIES * size`` tries at most; each key added is taken."""
        for i in range(NEIGHBOUR_TRIES * size):
            if len(genes) >= size:
                break
            child = edit(i)
            if child.key not in taken:
                genes.append(child)
                taken.add(child.key)
        return genes

    def _add_draws(self, genes: list, taken: set[str], size: int) -> list[AttentionGene]:
        """``genes`` filled up to ``size`` with random draws (``draw_new_gene``) whose keys are not
        ``taken``; each key added is taken."""
        while len(genes) < size:
            genes.append(draw_new_gene(self.rng, self.space, taken))
            taken.add(genes[-1].key)
        return genes

    # -- internals ------------------------------------------------------------------------------
    def _match(self, asked: list[AttentionGene], results) -> list[tuple[AttentionGene, float]]:
        """Pair each asked gene (in asked order) with a told fitness; order-independent."""
        items = results.items() if isinstance(results, Mapping) else results
        told: dict[str, list[float]] = defaultdict(list)
        for item in items:
            try:
                gene, fitness = item
            except (TypeError, ValueError):
                raise ValueError(f"tell() expects (gene, fitness) pairs, got {item!r}") from None
            key = AttentionGene.parse(gene).key
            told[key].append(self._told_value(fitness))
        wanted = Counter(g.key for g in asked)
        unexpected = sorted(set(told) - set(wanted))
        missing = sorted(set(wanted) - set(told))
        if unexpected or missing:
            raise ValueError(
                f"tell() for generation {self.generation} must cover exactly the asked genes; "
                f"missing: {missing or 'none'}; not asked: {unexpected or 'none'}"
            )
        for key, values in told.items():
            if len(values) not in (1, wanted[key]):
                raise ValueError(f"gene {key} was asked {wanted[key]} time(s) but told {len(values)} times")
            values.sort(key=lambda v: (ranking_key(key, v[0]), v) if isinstance(v, tuple)
                        else ranking_key(key, v))  # independent of the told order
            values *= wanted[key] // len(values)  # one value told for every copy
        return [(gene, told[gene.key].pop(0)) for gene in asked]


class Breeding(Strategy):
    """A strategy that breeds its children (GA, NSGA-II): ``mutation_rate``, ``crossover_rate``, and
    with ``dedupe`` a child that repeats a key is bred again (``_children``, ``DEDUPE_TRIES`` in all)."""

    CONFIG_FIELDS = Strategy.CONFIG_FIELDS + ("mutation_rate", "crossover_rate")
    DEDUPE_TRIES = 100

    def __init__(self, *, mutation_rate: float = 0.3, crossover_rate: float = 0.7, dedupe: bool = False, **batches):
        super().__init__(**batches)
        self.mutation_rate = as_rate("mutation_rate", mutation_rate)
        self.crossover_rate = as_rate("crossover_rate", crossover_rate)
        self.dedupe = as_bool("dedupe", dedupe)

    def _breed(self, first: AttentionGene, second: AttentionGene, rate: float | None = None) -> AttentionGene:
        """With probability ``crossover_rate`` the crossover of the parents, else a copy of the first;
        then mutated at ``rate`` (default ``mutation_rate``)."""
        child = first.crossover(second, self.rng, self.space) if self.rng.random() < self.crossover_rate else first
        return child.mutate(self.mutation_rate if rate is None else rate, self.rng, self.space)

    def _children(self, parents, breed) -> list[AttentionGene]:
        """A generation's children, each ``breed(first, second)`` of a new ``parents()`` pair; with
        ``dedupe``, a child that repeats one of the batch or one asked before is bred again from the
        same parents (``DEDUPE_TRIES`` breedings in all, then it is kept)."""
        children: list[AttentionGene] = []
        keys: set[str] = set()
        for _ in range(self.batch_size(self.generation)):
            first, second = parents()
            child = breed(first, second)
            bred = 1
            while self.dedupe and bred < self.DEDUPE_TRIES and (child.key in keys or child.key in self._asked_keys):
                child = breed(first, second)
                bred += 1
            children.append(child)
            keys.add(child.key)
        return children
