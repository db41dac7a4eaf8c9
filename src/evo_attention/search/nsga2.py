"""NSGA-II (Deb et al. 2002) over genes: non-dominated sorting and crowding distance select the
survivors, the genes' own crossover and mutation breed the offspring.

Generation 0 is the GA's. Every later generation breeds ``population_size - elite_size`` offspring
(the other strategies' batch size), each parent the winner of a binary tournament in the ranked
population, bred as the GA breeds (``Breeding``; ``dedupe`` on by default); then the population and
the offspring together (one copy of each gene) are ranked by front, then crowding distance
(``rank_members``), and the best ``population_size`` survive. With one objective this is a
(mu + lambda) evolutionary algorithm with tournament selection.
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
