"""Training-step speed of the real code path vs a plain fp32 eager implementation, same run.

    python benchmarks/bench_speed.py [--data-dir ../shared/data/wikitext-2] [--steps 10] [--rounds 3]

At the seed's config (vocab 10000, 128 dims, 2 layers, 4 heads, 128 tokens, batch 32) it times:
the plain model (reference_model.py, beside this script), and `evo-attention bench`'s path for the baseline gene, the seed's
best gene (dot|sparsemax|output_gate|learned) and the slowest similarity (additive), each compiled
or not as a 5000-step training would be (``compile: auto``). Rounds are interleaved so machine noise
hits every candidate alike; the median of the rounds is reported, with each candidate's speed-up
over the plain implementation and its ``mfu`` against the matmul limit of the precision it runs in
(the plain model's against the same limit, for comparison).
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from evo_attention import AttentionGene, Config, TinyTransformer
from evo_attention.train.bench import bench_gene
from evo_attention.data import data_from_config
from reference_model import PlainTransformer, plain_train_step  # beside this script

GENES = {
    "baseline": "dot|softmax|none|fixed",
    "seed-best": "dot|sparsemax|output_gate|learned",
    "additive": "additive|softmax|none|fixed",
}


def time_plain(config, data, steps, warmup=2):
    torch.manual_seed(config.seed)
    model = PlainTransformer.from_tiny(TinyTransformer(config.replace(vocab_size=data.vocab_size), AttentionGene.vanilla()))
    opt = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    batches = data.train_batches(config.batch_size, torch.Generator().manual_seed(0))
    for _ in range(warmup):
        plain_train_step(model, opt, *next(batches))
    start = time.perf_counter()
    for _ in range(steps):
        loss = plain_train_step(model, opt, *next(batches))
    loss.item()
    return (time.perf_counter() - start) / steps * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared/data/wikitext-2"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--genes", default=",".join(GENES))
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    config = Config(data="wikitext2", data_dir=args.data_dir, eval_steps=2)
    data = data_from_config(config)
    names = args.genes.split(",")
    times = {"plain": [], **{n: [] for n in names}}
    details = {}
    for r in range(args.rounds):
        times["plain"].append(time_plain(config, data, args.steps))
        for name in names:
            result = bench_gene(GENES[name], config, data, steps=args.steps, time_eval=False)
            times[name].append(result["ms_per_step"])
            details[name] = result
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f} ms" for k, v in times.items()), flush=True)
    plain = statistics.median(times["plain"])
    print(f"\nthreads {torch.get_num_threads()}, torch {torch.__version__}, precision "
          f"{details[names[0]]['precision']}, {args.rounds} rounds x {args.steps} steps (median)")
    peak = details[names[0]]["peak_flops_per_s"]
    print(f"matmul limit here: {peak / 1e9:.0f} GFLOP/s ({details[names[0]]['precision']} 2048^3 probe); "
          "mfu = achieved / limit")
    print(f"{'candidate':<12}{'ms/step':>10}{'speed-up vs plain':>20}{'GFLOP/s':>10}{'mfu':>7}{'compiled':>10}")
    plain_flops = details[names[0]]["flops_per_step"] / plain * 1e3
    print(f"{'plain fp32':<12}{plain:>10.0f}{1.0:>20.2f}{plain_flops / 1e9:>10.1f}{plain_flops / peak:>7.2f}{'no':>10}")
    summary = {"plain_ms": plain, "peak_flops_per_s": peak, "candidates": {}}
    for name in names:
        ms = statistics.median(times[name])
        flops = details[name]["flops_per_step"]
        achieved = flops / ms * 1e3
        compiled = "yes" if details[name]["compiled"] else "no"
        print(f"{name:<12}{ms:>10.0f}{plain / ms:>20.2f}{achieved / 1e9:>10.1f}{achieved / peak:>7.2f}{compiled:>10}")
        summary["candidates"][name] = {"gene": GENES[name], "ms_per_step": ms, "speedup": plain / ms,
                                       "flops_per_step": flops, "mfu": achieved / peak,
                                       "compiled": details[name]["compiled"]}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
