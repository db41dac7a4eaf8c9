"""evo-attention: let evolution design attention mechanisms for small transformer LMs.

The front door; everything else lives in the layers below (see docs/architecture.md)::

    from evo_attention import AttentionGene, Config, TinyTransformer, EvolvedAttention, Evolution
    from evo_attention import register_normalization, row_normalize, register_strategy

Extending the search space is public: ``register_similarity``, ``register_normalization``,
``register_gating`` and ``register_temperature`` add a component (it joins random draws and
mutations at once); ``register_op`` adds an op to the program language (grammar, random programs,
mutation and the engine at once); ``register_strategy`` adds a search strategy; ``register_task`` adds a generated
task (a ``data.synthetic.Task`` subclass: a data name, suite point and curve task at once) and
``register_dataset`` any other dataset.
"""

from evo_attention.util import threads as _threads

_threads.configure()  # how OpenMP threads wait, set before anything imports torch (util/threads.py)

from evo_attention.util.version import __version__  # noqa: E402

# Each name is imported from its home when first used (``evo_attention.X``, ``from evo_attention import X``),
# so a command that needs none of them (``--version``, ``status``) starts without importing torch.
_HOMES = {
    "AttentionGene": "evo_attention.genes", "SearchSpace": "evo_attention.genes",
    "Config": "evo_attention.train.config", "EvaluationRecord": "evo_attention.train.record",
    "Status": "evo_attention.train.record", "train_and_evaluate": "evo_attention.train.trainer",
    "Evolution": "evo_attention.studies.evolution", "EvolvedAttention": "evo_attention.nn.attention",
    "TinyTransformer": "evo_attention.nn.model", "Individual": "evo_attention.search",
    "Strategy": "evo_attention.search", "register_strategy": "evo_attention.search",
    "Search": "evo_attention.search.driver", "UserError": "evo_attention.util.errors",
    "register_dataset": "evo_attention.data", "register_task": "evo_attention.data",
    "register_op": "evo_attention.nn.program", "register_gating": "evo_attention.nn.components",
    "register_normalization": "evo_attention.nn.components", "register_similarity": "evo_attention.nn.components",
    "register_temperature": "evo_attention.nn.components", "row_normalize": "evo_attention.nn.components",
    "run_fitness_check": "evo_attention.studies.fitness",
}
_MODULES = {"components": "evo_attention.nn.components", "programs": "evo_attention.programs"}


def __getattr__(name: str):
    import importlib

    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    else:
        raise AttributeError(f"module 'evo_attention' has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = sorted([*_HOMES, "__version__", "components"])
