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

_threads.configure()  # how OpenMP threads wait, set before anything below imports torch (util/threads.py)

from evo_attention.data import register_dataset, register_task  # noqa: E402
from evo_attention.genes import AttentionGene, SearchSpace  # noqa: E402
from evo_attention.nn import components
from evo_attention.nn.attention import EvolvedAttention
from evo_attention.nn.components import (register_gating, register_normalization, register_similarity,
                                         register_temperature, row_normalize)
from evo_attention.nn.model import TinyTransformer
from evo_attention.nn.program import register_op
from evo_attention.search import Individual, Strategy, register_strategy
from evo_attention.search.driver import Search
from evo_attention.studies.evolution import Evolution
from evo_attention.train.config import Config
from evo_attention.train.record import EvaluationRecord, Status
from evo_attention.train.trainer import train_and_evaluate
from evo_attention.util.errors import UserError
from evo_attention.util.version import __version__

__all__ = [
    "AttentionGene",
    "Config",
    "EvaluationRecord",
    "Evolution",
    "EvolvedAttention",
    "Individual",
    "Search",
    "SearchSpace",
    "Status",
    "Strategy",
    "TinyTransformer",
    "UserError",
    "__version__",
    "components",
    "register_dataset",
    "register_gating",
    "register_normalization",
    "register_op",
    "register_similarity",
    "register_strategy",
    "register_task",
    "register_temperature",
    "row_normalize",
    "train_and_evaluate",
]
