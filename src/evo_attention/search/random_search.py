"""Random search: the baseline with the same evaluation budget as the genetic algorithm.

It asks in batches of the GA's sizes, each gene drawn uniformly among the keys not asked before
(repeats only once the space is exhausted); with the same seed its first batch is the GA's
generation 0. ``population`` is everything evaluated so far, best first; each ``history`` entry lists
that batch's members.

``NeighbourSearch`` (strategy ``neighbours``) is the control arm for "does evolution help": after
generation 0, every gene is one edit (``search.base.neighbour``) of a start gene drawn uniformly,
never a key asked before (random genes once the neighbourhood is spent). It needs a start
(``start_from``, vanilla by default) and refuses to run without one.
"""

from __future__ import annotations

from evo_attention.genes import AttentionGene
from evo_attention.search.base import Individual, Strategy, neighbour, rank_members
from evo_attention.util.errors import UserError


class RandomSearch(Strategy):
    """Uniform sampling without replacement, in GA-sized batches."""

    name = "random"

    def _propose(self) -> list[AttentionGene]:
        if self.generation == 0:
            return self._initial_genes()
        return self._add_draws([], set(self._asked_keys), self.batch_size(self.generation))

    def _update(self, told):
        self._batch = rank_members(self._member(gene, fitness) for gene, fitness in told)
        self.population = rank_members(self.population + self._batch)

    def _history_members(self, told) -> list[Individual]:
        return self._batch


class NeighbourSearch(RandomSearch):
    """Random one-edit neighbours of the start, in GA-sized batches (see the module docstring)."""

    name = "neighbours"
    default_start = "vanilla"

    def _propose(self) -> list[AttentionGene]:
        if not self._warm:
            raise UserError("the neighbours strategy samples one-edit neighbours of a start: set start_from to "
                            "vanilla, gene strings or a run", setting="start_from")
        if self.generation == 0:
            return self._initial_genes()
        taken, size = set(self._asked_keys), self.batch_size(self.generation)
        genes = self._add_neighbours([], taken, size, lambda i: neighbour(self.rng.choice(self._warm), self.rng,
                                                                          self.space))
        return self._add_draws(genes, taken, size)  # the neighbourhood is spent: random genes not asked before
