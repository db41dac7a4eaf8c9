"""The genetic algorithm of the original EvoAttention search.

Generation 0 is ``population_size`` distinct random genes. Every later generation keeps the best
``elite_size`` members unchanged (never asked again) and fills the other slots with offspring: two
parents drawn uniformly and independently from the best ``2 * elite_size`` members (at least 2),
their uniform crossover with probability ``crossover_rate`` (else a copy of the first), then each
field resampled with probability ``mutation_rate``. Failed members rank last.

Options (all off by default, which reproduces the original): ``mutation_schedule="adaptive"``, the
rate decays linearly from ``mutation_rate_start`` in generation 1 to ``mutation_rate`` in the last
(``mutation_rate_at``); ``seed_vanilla``, the vanilla transformer in generation 0; ``dedupe``, an
offspring that repeats a key asked before or in its generation is bred again (``Breeding._children``).
"""

from __future__ import annotations

import dataclasses

from evo_attention.util.errors import UserError
from evo_attention.genes import AttentionGene
from evo_attention.search.base import Breeding, as_rate, rank_members

SCHEDULES = ("constant", "adaptive")


class GeneticAlgorithm(Breeding):
    """Elitist genetic algorithm with uniform crossover and per-field mutation."""

    name = "ga"
    OPTIONS = {**Breeding.OPTIONS, "mutation_schedule": "constant", "mutation_rate_start": 0.6, "dedupe": False}

    def __init__(self, *, mutation_schedule: str = "constant", mutation_rate_start: float = 0.6, **settings):
        super().__init__(**settings)
        if mutation_schedule not in SCHEDULES:
            raise UserError(f"unknown mutation_schedule {mutation_schedule!r}: valid schedules are {', '.join(SCHEDULES)}")
        self.mutation_schedule = mutation_schedule
        self.mutation_rate_start = as_rate("mutation_rate_start", mutation_rate_start)

    def mutation_rate_at(self, generation: int) -> float:
        """The mutation rate used to breed generation ``generation`` (see the module doc)."""
        if self.mutation_schedule == "constant":
            return self.mutation_rate
        last = self.n_generations - 1
        if last <= 1 or generation <= 1:
            return self.mutation_rate_start
        t = min(1.0, (generation - 1) / (last - 1))
        rate = self.mutation_rate_start + (self.mutation_rate - self.mutation_rate_start) * t
        return min(1.0, max(0.0, rate))

    # -- ask/tell hooks -------------------------------------------------------------------------
    def _propose(self) -> list[AttentionGene]:
        if self.generation == 0:
            return self._initial_genes()
        rate = self.mutation_rate_at(self.generation)
        pool = [m.gene for m in self.population[: max(2 * self.elite_size, 2)]]  # the parents are drawn from these
        return self._children(lambda: (self.rng.choice(pool), self.rng.choice(pool)),
                              lambda first, second: self._breed(first, second, rate))

    def _update(self, told):
        # the elites carried over (none before generation 0 was told)
        elites = [dataclasses.replace(m, is_elite=True) for m in self.population[: self.elite_size]]
        newcomers = [self._member(gene, fitness) for gene, fitness in told]
        self.population = rank_members(elites + newcomers)
