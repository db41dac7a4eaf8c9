"""Random search: the baseline with the same evaluation budget as the genetic algorithm.

It asks in batches of the GA's sizes (``population_size`` first, then ``population_size -
elite_size``, ``n_generations`` batches), so both spend the same number of trainings. Each gene
is drawn uniformly from the search space among the keys not asked before in this run; only when
the space is exhausted do repeats occur. With the same seed its first batch equals the GA's
generation 0, so the two start from the same point.

``population`` is everything evaluated so far, best first; each ``history`` entry lists that
batch's members and the best result so far. ``seed_vanilla`` is honoured as in the GA; it takes no
other option (asking never repeats a gene, so there is nothing to dedupe).

``NeighbourSearch`` (strategy ``neighbours``) is the control arm for "does evolution help": random
one-edit sampling at the GA's budget. Generation 0 is random search's (the start and its one-edit
neighbours, so with one seed and start it equals the GA's and the climb's); every later gene is one
edit (``search.base.neighbour``) of a start gene drawn uniformly with the strategy's generator,
never a key asked before (``NEIGHBOUR_TRIES`` draws per gene; once the neighbourhood is spent,
random genes not asked before fill the batch). It needs a start: the driver starts it from vanilla
unless ``start_from`` says otherwise, as the climb; without one (``start_from: random``, or no
``warm_start``) it refuses.
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
