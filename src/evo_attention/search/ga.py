"""The genetic algorithm of the original EvoAttention search.

Generation 0 is ``population_size`` distinct random genes. Every later generation:

1. keeps the best ``elite_size`` members unchanged (they are not asked again, so never retrained);
2. fills the other ``population_size - elite_size`` slots with offspring. For each, two parents
   are drawn uniformly and independently from the best ``2 * elite_size`` members of the previous
   population (at least the best 2); with probability ``crossover_rate`` the child is the uniform
   crossover of the two, otherwise a copy of the first; then each field of the child is resampled
   with probability ``mutation_rate``.

With the defaults (12 x 10 generations, 3 elites) that is 12 + 9 * 9 = 93 fitness requests.
Failed members rank last, so they become parents only when fewer than ``2 * elite_size``
members succeeded.

Options (all off by default, which reproduces the original):

- ``mutation_schedule="adaptive"``: the mutation rate decays *linearly* from
  ``mutation_rate_start`` (default 0.6) in generation 1 to ``mutation_rate`` in the last
  generation (explore early, refine late). With only two generations, generation 1 uses
  ``mutation_rate_start``. ``"constant"`` (default) always uses ``mutation_rate``.
- ``seed_vanilla=True``: the vanilla transformer replaces one random gene of generation 0.
- ``dedupe=True``: an offspring whose key was already asked in this run, or repeats another
  offspring of its generation, is bred again from the same parents (up to 100 tries in all,
  then accepted). Without it duplicates are asked like any other gene; a result cache in the
  driver avoids training them twice.
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
