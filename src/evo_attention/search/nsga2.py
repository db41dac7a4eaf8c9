"""NSGA-II (Deb et al. 2002) over genes: non-dominated sorting and crowding distance select the
survivors, the genes' own crossover and mutation breed the offspring.

Generation 0 is ``population_size`` distinct random genes (the same as the GA's and random
search's for the same seed). Every later generation:

1. breeds ``population_size - elite_size`` offspring, so that it asks exactly as many genes as
   the other strategies. Each parent is the winner of a binary tournament: two members of the
   population drawn uniformly, the better in the crowded-comparison order wins (lower front, then
   larger crowding distance, then lower perplexity). With probability ``crossover_rate`` the child
   is the uniform crossover of two such parents, otherwise a copy of the first; then each field is
   resampled with probability ``mutation_rate``. With ``dedupe`` (on by default) a child whose key
   was asked before in this run, or repeats another child of its generation, is bred again (up to
   ``DEDUPE_TRIES`` tries in all, then accepted);
2. the population and the offspring together (one copy of each gene) are ranked by front, then
   crowding distance (``rank_members``: ``search.pareto``), and the best ``population_size`` of
   them survive.

With a single objective the fronts are the perplexity order and this is a (mu + lambda)
evolutionary algorithm with tournament selection. Failed members rank last.
"""

from __future__ import annotations

import dataclasses

from evo_attention.genes import AttentionGene
from evo_attention.search.base import Breeding, Individual, rank_members


class NSGA2(Breeding):
    """NSGA-II: (mu + lambda) survival by non-dominated front and crowding distance."""

    name = "nsga2"
    OPTIONS = {**Breeding.OPTIONS, "dedupe": True}

    def __init__(self, *, dedupe: bool = True, **settings):
        super().__init__(dedupe=dedupe, **settings)

    def _propose(self) -> list[AttentionGene]:
        if self.generation == 0:
            return self._initial_genes()
        return self._children(lambda: (self._tournament(), self._tournament()), self._breed)

    def _tournament(self) -> AttentionGene:
        """The better (earlier in the ranked population) of two members drawn uniformly."""
        n = len(self.population)
        return self.population[min(self.rng.randrange(n), self.rng.randrange(n))].gene

    def _update(self, told):
        survivors = [dataclasses.replace(m, is_elite=True) for m in self.population]  # carried over, not re-asked
        newcomers = [self._member(gene, fitness) for gene, fitness in told]
        unique: dict[str, Individual] = {}
        for member in survivors + newcomers:  # survivors first: a re-asked gene keeps its first result
            unique.setdefault(member.gene.key, member)
        self.population = rank_members(unique.values())[: self.population_size]
