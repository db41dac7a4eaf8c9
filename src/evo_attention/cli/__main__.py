"""``python -m evo_attention.cli``: the evo-attention command."""

import sys

from evo_attention.cli import main

sys.exit(main())
