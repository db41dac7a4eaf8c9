"""The search layer: strategies propose genes, the driver evaluates them through the runner and an
executor, the run store keeps every result.

Strategies (ask/tell, never train anything; docs/search.md): ``make_strategy(name, **settings)``
builds one by name, ``strategy_from_config(config)`` the one a Config names, and ``register_strategy``
adds a new one::

    @register_strategy("my_search")
    class MySearch(Strategy):
        def _propose(self): ...          # the genes of generation self.generation
        def _update(self, told): ...     # fold [(gene, perplexity)] into self.population
"""

from __future__ import annotations

import inspect

from evo_attention.search.base import Individual, Strategy, fitness_value, rank_members, ranking_key
from evo_attention.search.climb import HillClimb
from evo_attention.search.ga import GeneticAlgorithm
from evo_attention.search.nsga2 import NSGA2
from evo_attention.search.random_search import NeighbourSearch, RandomSearch
from evo_attention.search.tpe import TPE
from evo_attention.util.errors import UserError

STRATEGIES: dict[str, type[Strategy]] = {}


def register_strategy(name: str):
    """Class decorator: make a ``Strategy`` subclass available as ``strategy: name``."""
    if not isinstance(name, str) or not name.strip() or name != name.strip().lower():
        raise UserError(f"strategy name {name!r} must be a non-empty lower-case string")

    def decorator(cls):
        if not (isinstance(cls, type) and issubclass(cls, Strategy)):
            raise UserError(f"register_strategy({name!r}) decorates a Strategy subclass, not {cls!r}")
        if name in STRATEGIES and STRATEGIES[name] is not cls:
            raise UserError(f"strategy {name!r} is registered already (by {STRATEGIES[name].__module__}): choose "
                            "another name")
        cls.name = name
        STRATEGIES[name] = cls
        return cls

    return decorator


# TPE needs Optuna (the [tpe] extra), imported only when a TPE is built
for _builtin in (GeneticAlgorithm, RandomSearch, NeighbourSearch, NSGA2, HillClimb, TPE):
    register_strategy(_builtin.name)(_builtin)


def strategy_class(name: str) -> type[Strategy]:
    cls = STRATEGIES.get(name.strip().lower()) if isinstance(name, str) else None
    if cls is None:
        raise UserError(f"unknown search strategy {name!r}: valid strategies are {', '.join(STRATEGIES)}")
    return cls


def make_strategy(name: str, **settings) -> Strategy:
    """A new strategy ``name`` built with ``settings`` (population_size, seed, its own options)."""
    cls = strategy_class(name)
    accepted = {p for klass in cls.__mro__ if "__init__" in vars(klass)
                for p, v in inspect.signature(klass.__init__).parameters.items()
                if v.kind == inspect.Parameter.KEYWORD_ONLY}
    for key in settings:
        if key not in accepted:
            raise UserError(f"unknown option {key!r} for strategy {cls.name!r}: valid options are "
                            f"{', '.join(sorted(accepted))}")
    return cls(**settings)


def strategy_from_config(config) -> Strategy:
    """The strategy ``config.strategy`` with the config's settings (see ``Strategy.from_config``)."""
    return strategy_class(config.strategy).from_config(config)


__all__ = ["GeneticAlgorithm", "HillClimb", "Individual", "NeighbourSearch", "NSGA2", "RandomSearch", "TPE",
           "STRATEGIES", "Strategy", "fitness_value", "make_strategy", "rank_members", "ranking_key",
           "register_strategy", "strategy_from_config"]
