"""Search strategies: they propose genes and learn their fitness; they never train anything.

``make_strategy(name, **options)`` builds one by name (``"ga"`` or ``"random"``); see
``base.Strategy`` for the ask/tell protocol and ``base`` for how results are ranked.
"""

from __future__ import annotations

from ..errors import UserError
from .base import Member, Strategy, fitness_value, rank_members, ranking_key
from .ga import GeneticAlgorithm
from .random_search import RandomSearch

STRATEGIES: dict[str, type[Strategy]] = {
    GeneticAlgorithm.name: GeneticAlgorithm,
    RandomSearch.name: RandomSearch,
}


def make_strategy(name: str, **options) -> Strategy:
    """A new strategy ``name`` built with ``options`` (population_size, seed, ...)."""
    cls = STRATEGIES.get(name.strip().lower()) if isinstance(name, str) else None
    if cls is None:
        raise UserError(f"unknown search strategy {name!r}: valid strategies are {', '.join(STRATEGIES)}")
    return cls(**options)


__all__ = [
    "GeneticAlgorithm",
    "Member",
    "RandomSearch",
    "STRATEGIES",
    "Strategy",
    "fitness_value",
    "make_strategy",
    "rank_members",
    "ranking_key",
]
