"""Does this version do the same tensor work per training step as a reference checkout?

    git worktree add /tmp/ref 8769ca9     # 0.5, two attention engines
    python benchmarks/engine_ops.py --reference /tmp/ref --data-dir ../shared/data/wikitext-2 \\
        --out docs/results/engine/op-profile.json

For each cell of ``bench_engine.py`` (the vanilla gene and the seed study's best gene, at the quick
preset and the seed config, fp32 and bf16 where the CPU has native bf16), one fresh process per
version profiles three training steps (``torch.profiler``, CPU, input shapes recorded) after a warm
up, and the result lists every (operator, input shapes) pair whose count differs between the two.
Counts do not depend on the machine's load, so unlike step times this comparison is exact on a busy
machine; it says nothing of Python overhead between the operators, which ``bench_engine.py`` times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import GENES, REPO, cells, native_bf16  # noqa: E402  (the same cells as the timing)

PROFILE = r'''
import json, sys, torch
from torch.profiler import profile, ProfilerActivity
from evo_attention.data import data_from_config
from evo_attention.train.presets import build_config
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import step_seconds
preset, gene, precision, data_dir = sys.argv[1:5]
config = build_config(preset).replace(precision=precision, compile="off")
if preset == "seed":
    config = config.replace(data_dir=data_dir)
data = data_from_config(config)
trial = Trial.from_config(gene, config.replace(train_steps=5), data=data)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    step_seconds([trial], data, device=torch.device("cpu"), warmup=1, steps=3, repeats=1)
print(json.dumps({f"{e.key} {e.input_shapes}": e.count for e in prof.key_averages(group_by_input_shape=True)}))
'''


def profile(src: Path, preset: str, gene: str, precision: str, data_dir: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROFILE, preset, gene, precision, data_dir],
                          env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", required=True, help="a checkout of the version to compare with")
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "wikitext-2"))
    parser.add_argument("--out", help="the JSON result to write")
    args = parser.parse_args(argv)
    reference = Path(args.reference).resolve()
    ref_src = reference / "src" if (reference / "src").is_dir() else reference
    precisions = ["fp32"] + (["bf16"] if native_bf16() else [])
    result = {}
    for name, (preset, gene, precision) in cells(["quick", "seed"], precisions).items():
        this = profile(REPO / "src", preset, gene, precision, args.data_dir)
        ref = profile(ref_src, preset, gene, precision, args.data_dir)
        differ = {k: {"this": this.get(k, 0), "reference": ref.get(k, 0)} for k in sorted(set(this) | set(ref))
                  if this.get(k, 0) != ref.get(k, 0)}
        result[name] = {"operator_shapes": len(this), "calls": sum(this.values()),
                        "reference_calls": sum(ref.values()), "differ": differ}
        print(f"{name}: {len(this)} operator/shape pairs, {sum(this.values())} calls; "
              f"{len(differ)} differ from the reference", flush=True)
    from evo_attention.train.environment import machine, versions

    reference_commit = subprocess.run(["git", "-C", str(reference), "rev-parse", "HEAD"], capture_output=True,
                                      text=True).stdout.strip() or None
    out = {"kind": "engine-ops", "reference_commit": reference_commit, "genes": GENES, "cells": result,
           "machine": machine(), "versions": versions(),
           "command": "python benchmarks/engine_ops.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
