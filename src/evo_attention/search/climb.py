"""A (1 + lambda) hill climb (docs/search.md): mutate the incumbent, replace it only when a child is better.

Generation 0 is the seeded start (``start_from``, the vanilla gene by default) and one-edit neighbours
of it; its best is the incumbent. Each later generation asks ``population_size`` distinct one-edit
neighbours of the incumbent (``search.base.neighbour``), never one asked before; the best replaces
the incumbent only when its told fitness beats the incumbent's by more than ``min_gain`` (in a run
with caps, a smaller total violation first). ``population`` is everything evaluated, best first;
``elite_size`` is not used. One objective only. With racing a child that beats the incumbent is
measured on the incumbent's seeds, so the climb moves only on a gain that holds over paired seeds.
"""

from __future__ import annotations

import math

from evo_attention.genes import AttentionGene
from evo_attention.search.base import Individual, neighbour
from evo_attention.search.random_search import RandomSearch
from evo_attention.util.errors import UserError


class HillClimb(RandomSearch):
    """(1 + lambda) hill climbing from a seeded start: random search's bookkeeping (everything
    evaluated, ranked; each batch its history), other proposals, and an incumbent."""

    name = "climb"
    default_start = "vanilla"
    OPTIONS = {**RandomSearch.OPTIONS, "min_gain": 0.0}
    CONFIG_FIELDS = tuple(name for name in RandomSearch.CONFIG_FIELDS if name != "elite_size")

    def __init__(self, *, min_gain: float = 0.0, elite_size: int = 0, **settings):
        super().__init__(elite_size=elite_size, **settings)
        if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)) or not 0 <= min_gain < math.inf:
            raise UserError(f"min_gain {min_gain!r} must be a number >= 0", setting="min_gain")
        if self.n_objectives > 1:
            raise UserError("the climb strategy takes one objective: drop the others, or use nsga2",
                            setting="objectives")
        self.min_gain = float(min_gain)
        self.incumbent: Individual | None = None

    elite_places = 1  # the incumbent

    def batch_size(self, generation: int) -> int:
        return self.population_size

    def _propose(self) -> list[AttentionGene]:
        if self.generation == 0:
            return self._initial_genes()
        children = self._add_neighbours([], set(self._asked_keys), self.population_size,
                                        lambda i: neighbour(self.incumbent.gene, self.rng, self.space))
        while len(children) < self.population_size:  # the incumbent's neighbourhood is spent: a repeat
            children.append(neighbour(self.incumbent.gene, self.rng, self.space))
        return children

    def _update(self, told):
        super()._update(told)
        best = self._batch[0]
        incumbent = self.incumbent  # a smaller violation of the run's caps first (0: feasible), then the gain
        if incumbent is None or (best.violation, best.perplexity + self.min_gain) < (incumbent.violation,
                                                                                     incumbent.perplexity):
            self.incumbent = best
