"""The feed-forward width of the vanilla model matched to a gene's parameter count (study 3's D4,
docs/findings.md), for the settings a command's flags give.

    python benchmarks/findings3_width.py --gene GENE -- [validate's data and model flags]

Prints the width ``nn.matching.matched_baseline`` gives (the one ``validate --match-params`` would
train), so that ``evo-attention baseline --ffn W --lr-grid ...`` tunes the matched model on the grid.
"""

from __future__ import annotations

import argparse
import sys

from evo_attention.cli import build_parser
from evo_attention.cli.common import config_from_args
from evo_attention.data import data_from_config
from evo_attention.nn.matching import matched_baseline


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    own = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    own.add_argument("--gene", required=True)
    gene = own.parse_args(argv[:split]).gene
    args = build_parser().parse_args(["validate", "--genes", gene, *argv[split + 1:]])
    config = config_from_args(args)
    data = data_from_config(config)
    spec = config.model.with_data(data.vocab_size, data.seq_len)
    print(matched_baseline(spec, gene)["ffn_dim"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
