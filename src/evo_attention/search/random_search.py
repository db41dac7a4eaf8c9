"""Random search: the baseline with the same evaluation budget as the genetic algorithm.

It asks in batches of the GA's sizes (``population_size`` first, then ``population_size -
elite_size``, ``n_generations`` batches), so both spend the same number of trainings. Each gene
is drawn uniformly from the search space among the keys not asked before in this run; only when
the space is exhausted do repeats occur. With the same seed its first batch equals the GA's
generation 0, so the two start from the same point.

``population`` is everything evaluated so far, best first; each ``history`` entry lists that
batch's members and the best result so far. ``seed_vanilla`` is honoured as in the GA; it takes no
other option (asking never repeats a gene, so there is nothing to dedupe).
"""

from __future__ import annotations

from evo_attention.genes import AttentionGene
from evo_attention.search.base import Individual, Strategy, draw_new_gene, rank_members


class RandomSearch(Strategy):
    """Uniform sampling without replacement, in GA-sized batches."""

    name = "random"

    def _propose(self) -> list[AttentionGene]:
        if self.generation == 0:
            return self._initial_genes()
        taken = set(self._asked_keys)
        genes = []
        for _ in range(self.batch_size(self.generation)):
            gene = draw_new_gene(self.rng, self.space, taken)
            genes.append(gene)
            taken.add(gene.key)
        return genes

    def _update(self, told):
        self._batch = rank_members(self._member(gene, fitness) for gene, fitness in told)
        self.population = rank_members(self.population + self._batch)

    def _history_members(self, told) -> list[Individual]:
        return self._batch
