"""evo-attention: let evolution design attention mechanisms for small transformer LMs.

The public names::

    from evo_attention import AttentionGene, EvolvedAttention, TinyTransformer, Config, Evolution, Individual
"""

from .attention import EvolvedAttention
from .config import Config
from .errors import UserError
from .evolution import Evolution, Individual
from .genes import AttentionGene, SearchSpace
from .model import TinyTransformer

__version__ = "0.2.0"

__all__ = [
    "AttentionGene",
    "Config",
    "Evolution",
    "EvolvedAttention",
    "Individual",
    "SearchSpace",
    "TinyTransformer",
    "UserError",
    "__version__",
]
