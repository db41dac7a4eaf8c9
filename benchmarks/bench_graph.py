"""A training step replayed as a CUDA graph against the eager step: seconds per step, one model.

    python benchmarks/bench_graph.py --data-dir .devdata/wikitext-2 --out graph.json

For each config of ``--configs`` (``quick``, ``seed``: as in bench_gpu.py; ``seed`` needs
``--data-dir``) and each precision of ``--precisions``, one model of ``--gene`` (default the vanilla
gene, attention dropout 0.10; model dropout as the config has it) on the counter dropout stream
(masks computed on the device: the stream a graph can replay), trained by a fresh ``Trainer`` per
measurement with ``cuda_graph auto`` (the step captured after ``CAPTURE_AFTER`` eager steps, then
replayed) and ``off`` (eager): ``--warmup`` untimed steps (at least the capture's), then ``--steps``
timed ones; the arms alternate in ``--rounds`` interleaved rounds; the median over rounds is kept,
with each arm's ``graph_state`` (how its steps ran) and the ratio graphed / eager, and trainings per
hour at the config's budget (training steps only). ``--loss-chunk N`` trains both arms with the
fused loss in chunks of N rows instead of ``nn.losses.DEFAULT_CHUNK`` (256, measured on a CPU), to
measure what a larger chunk does on a GPU. On a CPU both arms run eagerly (``graph_state`` says so):
``--smoke`` checks that the script runs. One JSON file (``--out``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import device_info, free_memory, make_config  # noqa: E402 - the benchmarks' own helpers

from evo_attention.data import data_from_config  # noqa: E402
from evo_attention.genes import AttentionGene  # noqa: E402
from evo_attention.nn import losses  # noqa: E402
from evo_attention.train.graph import CAPTURE_AFTER  # noqa: E402
from evo_attention.train.spec import Trial  # noqa: E402
from evo_attention.train.trainer import step_seconds  # noqa: E402

ARMS = {"graph": "auto", "eager": "off"}


def measure(gene, config, data, device, mode: str, warmup: int, steps: int) -> dict:
    cfg = config.replace(cuda_graph=mode, dropout_stream="counter", train_steps=warmup + steps,
                         log_every=warmup + steps)
    free_memory(device)
    trainer, seconds = step_seconds([Trial.from_config(gene, cfg, seed=0, data=data)], data, device=device,
                                    warmup=warmup, steps=steps)
    out = {"seconds": seconds, "graph_state": trainer.graph_state() or "eager: not on CUDA",
           "precision": trainer.precision}
    del trainer
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="quick,seed")
    parser.add_argument("--precisions", default="bf16")
    parser.add_argument("--gene", default="dot|softmax|none|fixed|bias|0.10")
    parser.add_argument("--data-dir")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=CAPTURE_AFTER + 2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--loss-chunk", type=int, help="rows per chunk of the fused loss (default: the product's)")
    parser.add_argument("--smoke", action="store_true", help="tiny models, one round, 2 steps")
    parser.add_argument("--out", default="graph.json")
    args = parser.parse_args(argv)
    if args.warmup < CAPTURE_AFTER:
        parser.error(f"--warmup must be at least {CAPTURE_AFTER}: the steps before the capture")
    if args.smoke:
        args.rounds, args.steps = 1, 2
    if args.loss_chunk is not None:
        if args.loss_chunk < 1:
            parser.error("--loss-chunk must be a whole number of rows >= 1")
        losses.DEFAULT_CHUNK = args.loss_chunk
    device = torch.device(args.device)
    gene = AttentionGene.parse(args.gene)
    result = {"benchmark": "bench_graph", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": device_info(device), "gene": gene.key,
              "settings": {"rounds": args.rounds, "warmup": args.warmup, "steps": args.steps,
                           "capture_after": CAPTURE_AFTER, "dropout_stream": "counter", "models": 1,
                           "loss_chunk": losses.DEFAULT_CHUNK},
              "rows": []}
    for name in args.configs.split(","):
        if name == "seed" and not args.data_dir:
            result["rows"].append({"config": name, "status": "skipped: needs --data-dir"})
            continue
        config = make_config(name, args.data_dir, args.smoke)
        data = data_from_config(config)
        for precision in args.precisions.split(","):
            cfg = config.replace(precision=precision)
            runs = {arm: [] for arm in ARMS}
            for r in range(args.rounds):
                for arm in (list(ARMS) if r % 2 == 0 else list(reversed(ARMS))):
                    runs[arm].append(measure(gene, cfg, data, device, ARMS[arm], args.warmup, args.steps))
            row = {"config": name, "precision": precision, "budget_steps": config.train_steps}
            for arm, got in runs.items():
                ms = statistics.median(g["seconds"] for g in got) * 1e3
                row[arm] = {"ms_per_step": ms, "round_ms": [g["seconds"] * 1e3 for g in got],
                            "graph_state": got[-1]["graph_state"],
                            "trainings_per_hour": 3600e3 / (ms * config.train_steps)}
            row["graph_over_eager"] = row["graph"]["ms_per_step"] / row["eager"]["ms_per_step"]
            result["rows"].append(row)
            print(f"{name} {precision}: graph {row['graph']['ms_per_step']:.2f} ms/step "
                  f"({row['graph']['graph_state']}), eager {row['eager']['ms_per_step']:.2f} ms/step: "
                  f"{row['graph_over_eager']:.2f}x", flush=True)
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
