"""Step time of this version against a reference checkout, side by side in interleaved rounds.

    git worktree add /tmp/ref 8769ca9     # the version to compare with (here: 0.5, two attention engines)
    python benchmarks/bench_engine.py --reference /tmp/ref --data-dir ../shared/data/wikitext-2 \\
        --out docs/results/engine/step-time.json

Cells: the vanilla gene and the seed study's best gene (``dot|sparsemax|output_gate|learned``) at the
quick preset and at the seed config (WikiText-2, 128 x 2, batch 32), in fp32 and, where the CPU has
native bf16, in bf16. Each round runs one fresh process per version (their order alternates between
rounds), which times every cell once (``trainer.step_seconds``: warm-up steps, then the fastest of
``--repeats`` timings of ``--steps`` steps). The result keeps every per-round time, the within-round
ratio this / reference per cell, and their medians. Run it on an otherwise idle machine, with a
fresh ``EVO_ATTENTION_CACHE_DIR`` (the corpus is tokenized once, before any timing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GENES = {"vanilla": "dot|softmax|none|fixed|bias|0.10", "seed best": "dot|sparsemax|output_gate|learned"}

# one process: time every cell once, print {cell: ms per step}
TIMER = r'''
import json, sys, torch
from evo_attention.data import data_from_config
from evo_attention.train.presets import build_config
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import step_seconds
cells, data_dir, steps, repeats = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
out, loaded = {}, {}
for name, (preset, gene, precision) in cells.items():
    config = build_config(preset).replace(precision=precision, compile="off")
    if preset == "seed":
        config = config.replace(data_dir=data_dir)
    if preset not in loaded:
        loaded[preset] = data_from_config(config)
    data = loaded[preset]
    trial = Trial.from_config(gene, config.replace(train_steps=2 + repeats * steps), data=data)
    _, seconds = step_seconds([trial], data, device=torch.device("cpu"), warmup=2, steps=steps, repeats=repeats)
    out[name] = 1000 * seconds
print(json.dumps(out))
'''


def native_bf16() -> bool:
    import torch
    return torch.backends.cpu.get_cpu_capability() in ("AVX512", "AVX512_BF16", "AMX") and "avx512_bf16" in \
        Path("/proc/cpuinfo").read_text()


def cells(presets, precisions) -> dict:
    return {f"{preset} {gene} {precision}": (preset, key, precision)
            for preset in presets for gene, key in GENES.items() for precision in precisions}


def run_version(src: Path, named: dict, data_dir: str, steps: int, repeats: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([sys.executable, "-c", TIMER, json.dumps(named), data_dir, str(steps), str(repeats)],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", required=True, help="a checkout of the version to compare with")
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "wikitext-2"))
    parser.add_argument("--presets", default="quick,seed")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per timing")
    parser.add_argument("--repeats", type=int, default=2, help="timings per cell and round (the fastest kept)")
    parser.add_argument("--out", help="the JSON result to write")
    args = parser.parse_args(argv)
    precisions = ["fp32", "bf16"] if native_bf16() else ["fp32"]
    named = cells(args.presets.split(","), precisions)
    versions = {"this": REPO / "src", "reference": Path(args.reference) / "src"}
    times: dict = {v: {c: [] for c in named} for v in versions}
    for r in range(args.rounds):
        for version in (list(versions) if r % 2 == 0 else list(reversed(versions))):
            for cell, ms in run_version(versions[version], named, args.data_dir, args.steps, args.repeats).items():
                times[version][cell].append(ms)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    summary = {}
    for cell in named:
        ratios = [a / b for a, b in zip(times["this"][cell], times["reference"][cell])]
        summary[cell] = {"this_ms": statistics.median(times["this"][cell]),
                         "reference_ms": statistics.median(times["reference"][cell]),
                         "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    reference_commit = subprocess.run(["git", "-C", args.reference, "rev-parse", "HEAD"], capture_output=True,
                                      text=True).stdout.strip()
    models = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
              if line.startswith("model name")] if Path("/proc/cpuinfo").exists() else []
    result = {"kind": "engine-step-time", "reference_commit": reference_commit, "rounds": args.rounds,
              "steps": args.steps, "repeats": args.repeats,
              "machine": f"{models[0]}, {os.cpu_count()} cores" if models else platform.machine(),
              "cells": {c: list(v) for c, v in named.items()}, "ms_per_step": times, "summary": summary,
              "command": "python benchmarks/bench_engine.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for cell, s in summary.items():
        print(f"{cell}: this {s['this_ms']:.1f} ms, reference {s['reference_ms']:.1f} ms per step, "
              f"ratio {s['ratio_median']:.3f} (rounds {s['ratio_min']:.3f}..{s['ratio_max']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
