"""A learning rate per candidate (``rate_grid``; docs/search.md): every gene at its own best rate of a grid.

Each gene the strategy asks for (and the baseline) is first trained at every rate of the grid on the
**tuning seed** (``seed + TUNING_FROM``, which no verdict, fresh check or racing seed reaches), its
rate chosen by ``select_rate``, then trained at that rate on the run's seed: that value is told, so
it is not selected on its own noise. The chosen rate becomes the gene's ``lr=`` part everywhere but
in the strategy, which edits the gene without it (every neighbour is tuned afresh). A gene that sets
its own rate is not tuned. Tuning trainings have the role ``tune``; the store's meta ``rate_grid``
lists the grid, the seed and every gene's values and choice. Resuming replays every choice.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Mapping, Sequence

from evo_attention.genes import AttentionGene, recipe_of, with_recipe
from evo_attention.train.config import TUNING_FROM

if TYPE_CHECKING:
    from evo_attention.search.base import Individual
    from evo_attention.search.runner import Runner

TUNE_ROLE = "tune"
RATE_META = "rate_grid"
RULE = "each gene at every rate on the tuning seed; its rate: no failure, then the best value, then the smaller rate"


def select_rate(curve: Sequence[Mapping], lower_is_better: bool = True) -> float:
    """The selected rate of a curve (points ``{"lr", "mean", "n_failed"}``): fewest failed tuning
    seeds, then the best mean, then the smaller rate."""
    sign = 1.0 if lower_is_better else -1.0

    def order(point: Mapping):
        mean = point.get("mean")
        known = mean is not None and math.isfinite(mean)
        return point.get("n_failed") or 0, 0 if known else 1, sign * mean if known else 0.0, point["lr"]

    return min(curve, key=order)["lr"]


class Tuned:
    """A filter in front of a ``Plain`` or ``Suite`` evaluation, which it stands for otherwise (see
    the module docstring); ``Racing`` may stand in front of it (a raced gene is raced at its rate)."""

    def __init__(self, inner, grid: Sequence[float]):
        self.inner, self.grid = inner, tuple(grid)
        self.seed = int(inner.config.seed) + TUNING_FROM
        self.genes: dict[str, dict] = {}  # asked key -> {"gene", "tuned", "rate", "curve", "generation"}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def start(self, runner: Runner, keep_models: int, baseline: AttentionGene | None) -> Individual | None:
        self.inner.start(runner, keep_models, None)
        if baseline is None:
            return None
        self._tune([baseline.key], None)
        return self.inner.baseline(AttentionGene.parse(self.shown(baseline.key)))

    def shown(self, key: str) -> str:
        """The gene as it is trained and shown: with its chosen rate."""
        return self.genes[key]["tuned"] if key in self.genes else key

    def fitness(self, keys: list, generation: int) -> dict:
        self._tune([k for k in keys if k not in self.genes], generation)
        told = self.inner.fitness(list(dict.fromkeys(self.shown(k) for k in keys)), generation)
        return {k: told[self.shown(k)] for k in keys}

    def scores(self, pairs: list, generation: int | None, role: str = "search") -> dict:
        told = self.inner.scores(list(dict.fromkeys((self.shown(k), s) for k, s in pairs)), generation, role=role)
        return {(k, s): told[self.shown(k), s] for k, s in pairs}

    def individual(self, member: Individual) -> Individual:
        shown = self.shown(member.gene.key)
        return self.inner.individual(member if shown == member.gene.key else
                                     replace(member, gene=AttentionGene.parse(shown)))

    def _tune(self, keys: list, generation: int | None) -> None:
        fixed = [k for k in keys if recipe_of(k).get("learning_rate") is not None]  # a gene's own rate stays
        self.genes.update({k: {"gene": k, "tuned": k, "rate": None, "curve": None, "generation": generation}
                           for k in fixed})
        todo = [k for k in keys if k not in fixed]
        if not todo:
            return
        at = {(k, rate): with_recipe(k, {"learning_rate": rate}).key for k in todo for rate in self.grid}
        view = self.runner.view
        if view is not None:
            view.extend(len(at) * self.per_request)
        told = self.inner.scores([(variant, self.seed) for variant in at.values()], generation, role=TUNE_ROLE)
        for key in todo:
            curve = [{"lr": rate, "mean": told[at[key, rate], self.seed],
                      "n_failed": int(told[at[key, rate], self.seed] is None)} for rate in self.grid]
            rate = select_rate(curve)
            self.genes[key] = {"gene": key, "tuned": at[key, rate], "rate": rate, "curve": curve,
                               "generation": generation}
        self.store.set_meta(RATE_META, {"grid": list(self.grid), "seed": self.seed, "rule": RULE,
                                        "genes": list(self.genes.values())})
