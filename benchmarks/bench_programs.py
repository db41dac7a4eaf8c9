"""Step time of a program against the classic gene it equals, in interleaved rounds.

    python benchmarks/bench_programs.py --out docs/results/programs/step-time.json

At the quick preset (fp32, the preset's batch and attention dropout) each pair of arms computes
the same function: the classic gene's modules, and its program run by ``nn.program``. Every round
times each arm's training steps once (``trainer.step_seconds``: warm-up steps first, the fastest
of ``--repeats`` timings), in an order that alternates between rounds, so load that drifts
during the run falls on both arms alike. The result keeps each arm's per-round ms per step, the
within-round ratio program / classic per pair, and their medians. Run it on an otherwise idle
machine (a second busy process distorts every timing on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

from evo_attention import Config, programs
from evo_attention.data import data_from_config
from evo_attention.genes import AttentionGene
from evo_attention.train.presets import build_config
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import step_seconds

PAIRS = {  # name: classic gene (the vanilla gene's bias and attention dropout)
    "softmax": "dot|softmax|none|fixed",
    "output gate, learned temperature": "dot|softmax|output_gate|learned",
    "sparsemax": "dot|sparsemax|none|fixed",
}


def arms() -> dict:
    out = {}
    for name, key in PAIRS.items():
        gene = AttentionGene.parse(key)
        text = programs.classic_program(gene.similarity, gene.normalization, gene.gating, gene.temperature_mode)
        out[f"{name} (classic)"] = gene.key
        out[f"{name} (program)"] = AttentionGene.parse(f"prog={text}").key
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per timing")
    parser.add_argument("--repeats", type=int, default=2, help="timings per arm and round (the fastest kept)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round: checks that it runs")
    parser.add_argument("--out", help="the JSON result to write")
    args = parser.parse_args(argv)
    config = build_config("quick").replace(precision="fp32", compile="off")
    if args.smoke:
        config = config.replace(d_model=16, n_heads=2, batch_size=4, recall={**config.recall, "train_examples": 200,
                                                                          "eval_examples": 20})
        args.rounds, args.steps, args.repeats = 1, 1, 1
    data = data_from_config(config)
    named = arms()
    span = 2 + args.repeats * args.steps
    times: dict = {name: [] for name in named}
    for r in range(args.rounds):
        order = list(named) if r % 2 == 0 else list(reversed(named))
        for name in order:
            trial = Trial.from_config(named[name], config.replace(train_steps=span), data=data)
            _, seconds = step_seconds([trial], data, device=torch.device("cpu"), warmup=2, steps=args.steps,
                                      repeats=args.repeats)
            times[name].append(1000 * seconds)
    pairs = {}
    for name in PAIRS:
        classic, program = times[f"{name} (classic)"], times[f"{name} (program)"]
        ratios = [p / c for p, c in zip(program, classic)]
        pairs[name] = {"classic_ms": statistics.median(classic), "program_ms": statistics.median(program),
                       "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    result = {"kind": "program-step-time", "preset": "quick", "precision": "fp32", "rounds": args.rounds,
              "steps": args.steps, "repeats": args.repeats, "threads": torch.get_num_threads(),
              "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
              "arms": named, "ms_per_step": times, "pairs": pairs,
              "command": "python benchmarks/bench_programs.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    for name, p in pairs.items():
        print(f"{name}: classic {p['classic_ms']:.2f} ms, program {p['program_ms']:.2f} ms per step, "
              f"ratio {p['ratio_median']:.3f} (rounds {p['ratio_min']:.3f}..{p['ratio_max']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
