"""Racing (``elite_seeds`` K > 1; docs/search.md): a gene that would enter the elite is measured again first.

After a generation's candidates are trained, repeatedly the best not yet raced candidate whose
one-seed value beats the ``elite_places``-th best lower bound so far (``Strategy.elite_places``;
every candidate beats it while fewer genes have raced), up to ``elite_places`` at a time, is trained
on K - 1 more seeds, until none does; the strategy is told its **lower bound** (``lower_bound``: the
mean over the K seeds plus its standard error; a failure on any seed fails the gene). So every gene
in the elite places was raced, all on the same seeds (paired), and a gene never raced is told its
one-seed value. The baseline is raced too. The seeds (``race_seeds``) are the run's seed and the top
of its seed block, which no validation or fresh check reaches. Trainings have the role ``race``; the
store's meta ``racing`` lists every raced gene with its seeds and values. Each decision depends only
on stored results, so resuming replays it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import TYPE_CHECKING

from evo_attention.search.store import RACING_META

if TYPE_CHECKING:  # the report reads RACING_META: no training machinery imported with it
    from evo_attention.genes import AttentionGene
    from evo_attention.search.base import Individual
    from evo_attention.search.runner import Runner

RACE_ROLE = "race"
RACE_SEEDS_FROM = 2000  # = studies.common.SEED_BLOCK_SIZE: the last seed of the run seed's block (tested)
RULE = "mean + standard error over the seeds"


def race_seeds(seed: int, k: int) -> list[int]:
    """The K seeds every raced gene is measured on: the run's seed first."""
    return [int(seed)] + [int(seed) + RACE_SEEDS_FROM - i for i in range(k - 1)]


def lower_bound(values: list) -> float | None:
    """The pessimistic value of minimised ``values`` (one per seed): mean + standard error; None
    when any seed failed."""
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    return statistics.fmean(values) + statistics.stdev(values) / math.sqrt(len(values))


class Racing:
    """A filter in front of any evaluation with ``scores`` (``Plain``, ``Capped``, ``Suite``), which
    it stands for otherwise (see the module docstring)."""

    def __init__(self, inner, elite_seeds: int, places: int):
        self.inner, self.places = inner, max(1, int(places))
        self.seeds = race_seeds(inner.config.seed, elite_seeds)
        self.raced: dict[str, dict] = {}  # gene key -> {"gene", "generation", "values", "told"}
        self.baseline_race: dict | None = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def start(self, runner: Runner, keep_models: int, baseline: AttentionGene | None) -> Individual | None:
        individual = self.inner.start(runner, keep_models, baseline)
        if individual is None:
            return None
        told = None if math.isinf(individual.perplexity) else individual.perplexity
        self.baseline_race = self._race({baseline.key: told}, None)[baseline.key]
        self._write()
        bound = self.baseline_race["told"]
        return replace(individual, perplexity=math.inf if bound is None else bound)

    def fitness(self, keys: list, generation: int) -> dict:
        told = self.inner.fitness(keys, generation)
        told.update({k: self.raced[k]["told"] for k in keys if k in self.raced})
        while True:  # the threshold: the ``places``-th best lower bound so far
            bounds = sorted(math.inf if r["told"] is None else r["told"] for r in self.raced.values())
            threshold = bounds[self.places - 1] if len(bounds) >= self.places else math.inf
            queue = sorted((told[k], k) for k in keys if k not in self.raced and told[k] is not None
                           and told[k] < threshold)[: self.places]
            if not queue:
                break
            self.raced.update(self._race({k: v for v, k in queue}, generation))
            told.update({k: self.raced[k]["told"] for _, k in queue})
        self._write()
        return told

    def _race(self, first: dict, generation: int | None) -> dict:
        """Each gene of ``first`` (key -> its told value on the run's seed) measured on the other seeds."""
        pairs = [(k, s) for k in first for s in self.seeds[1:]]
        if self.runner.view is not None:
            self.runner.view.extend(len(pairs) * self.per_request)
        extra = self.inner.scores(pairs, generation, role=RACE_ROLE)
        return {key: {"gene": self.inner.shown(key), "generation": generation, "values": values,
                      "told": lower_bound(values)}
                for key, value in first.items() for values in [[value] + [extra[key, s] for s in self.seeds[1:]]]}

    def _write(self) -> None:
        self.store.set_meta(RACING_META, {"seeds": self.seeds, "places": self.places, "rule": RULE,
                                          "genes": list(self.raced.values()), "baseline": self.baseline_race})
