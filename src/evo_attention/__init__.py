"""evo-attention: let evolution design attention mechanisms for small transformer LMs.

The public names::

    from evo_attention import AttentionGene, EvolvedAttention, TinyTransformer, Config
"""

from .attention import EvolvedAttention
from .config import Config
from .errors import UserError
from .genes import AttentionGene, SearchSpace
from .model import TinyTransformer

__version__ = "0.1.0"

__all__ = [
    "AttentionGene",
    "Config",
    "EvolvedAttention",
    "SearchSpace",
    "TinyTransformer",
    "UserError",
    "__version__",
]
