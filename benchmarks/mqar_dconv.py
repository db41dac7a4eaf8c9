"""MQAR at 8 pairs in 64 tokens with the quick model: does dconv=3 solve it within 1,000 steps?

    python benchmarks/mqar_dconv.py --out docs/results/mqar-dconv/mqar-dconv.json

The quick preset's model (64-dim, 2 layers, batch 32), the task ``mqar:seq_len=64,vocab=64,pairs=8``,
1,000 steps, no dropout (model or attention), the preset's learning rate; each gene on seeds
1..N (``--seeds``). A seed *solves* the task when its validation accuracy reaches ``--threshold``
(0.9); the result keeps every seed's accuracy, the solve count with its exact (Clopper-Pearson)
interval, and the CPU seconds of each training. Genes: softmax without dropout, and the same with
``dconv=3`` (depthwise causal convolutions of q, k and v: Primer's MDHA).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from evo_attention.data import data_from_config
from evo_attention.train.presets import build_config
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import run_training
from evo_attention.util import stats

GENES = {"softmax": "dot|softmax|none|fixed|bias|0.00", "softmax+dconv3": "dot|softmax|none|fixed|bias|0.00|dconv=3"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--genes", default=",".join(GENES), help="names of GENES to train, in order")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    config = build_config("quick", overrides={"data": "mqar:seq_len=64,vocab=64,pairs=8", "max_seq_len": 64,
                                              "vocab_size": 64, "dropout": 0.0, "train_steps": args.steps,
                                              "precision": "fp32", "compile": "off"})
    data = data_from_config(config)
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.is_file() else {}
    result.update({"kind": "mqar-dconv", "task": config.data, "steps": args.steps, "threshold": args.threshold,
                   "model": {"d_model": config.d_model, "n_layers": config.n_layers, "n_heads": config.n_heads,
                             "batch_size": config.batch_size, "learning_rate": config.learning_rate},
                   "no_recall_level": 1 / 8, "machine": platform.processor() or platform.machine(),
                   "threads": torch.get_num_threads(), "torch": torch.__version__,
                   "command": "python benchmarks/mqar_dconv.py " + " ".join(argv if argv is not None else sys.argv[1:])})
    genes = result.setdefault("genes", {})
    for name in args.genes.split(","):
        row = genes.setdefault(name, {"gene": GENES[name], "seeds": {}})
        for seed in range(1, args.seeds + 1):
            if str(seed) in row["seeds"]:
                continue  # kept from an earlier, interrupted run
            start = time.process_time()
            record = run_training(Trial.from_config(GENES[name], config.replace(seed=seed), data=data), data).record
            row["seeds"][str(seed)] = {"accuracy": record.accuracy, "cpu_s": time.process_time() - start,
                                       "status": str(record.status)}
            solved = sum(s["accuracy"] >= args.threshold for s in row["seeds"].values())
            rate = stats.solve_rate(solved, len(row["seeds"]))
            row.update({"solved": solved, "n": len(row["seeds"]), "solve_rate": rate})
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2) + "\n")
            print(f"{name} seed {seed}: accuracy {record.accuracy:.4f}; solved {solved} of {len(row['seeds'])}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
