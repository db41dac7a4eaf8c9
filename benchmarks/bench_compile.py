"""Does torch.compile pay for the training step? Eager vs compiled model, same run, interleaved.

    python benchmarks/bench_compile.py [--data-dir ../shared/data/wikitext-2] [--rounds 6] [--steps 6]

For each gene two Trainers are built at the seed's config, one with ``compile: off`` and one with
``compile: on`` (the model's forward, every block, and its backward through AOTAutograd go through
``torch.compile``). Rounds alternate between them so machine noise hits both alike; the median
ms/step is reported, with the compile time (the first three steps, which hold it) and after how
many steps it is repaid. What this measures decides ``environment.COMPILE_PAYS``, which genes
``compile: auto`` compiles. The first run on a machine compiles cold; later runs read Inductor's
on-disk cache and compile in a few seconds.
"""

import argparse
import statistics
import time
from pathlib import Path

import torch

from evo_attention import Config
from evo_attention.data import data_from_config
from evo_attention.train.trainer import Trainer

GENES = {
    "baseline": "dot|softmax|none|fixed",
    "baseline-no-dropout": "dot|softmax|none|fixed|bias|0.00",
    "seed-best": "dot|sparsemax|output_gate|learned",
    "additive": "additive|softmax|none|fixed",
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared/data/wikitext-2"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--genes", default=",".join(GENES))
    parser.add_argument("--budget", type=int, default=5000, help="training steps the compile time is spread over")
    args = parser.parse_args()
    config = Config(data="wikitext2", data_dir=args.data_dir, eval_steps=2, train_steps=10 ** 6, log_every=10 ** 6)
    data = data_from_config(config)
    print(f"threads {torch.get_num_threads()}, torch {torch.__version__}, {args.rounds} rounds x {args.steps} steps")
    print(f"{'gene':<22}{'eager ms':>10}{'compiled ms':>13}{'speed-up':>10}{'compile s':>11}{'pays after':>12}")
    for name in args.genes.split(","):
        eager = Trainer.from_config(GENES[name], config.replace(compile="off"), data)
        compiled = Trainer.from_config(GENES[name], config.replace(compile="on"), data)
        eager.train(until_step=3)
        start = time.perf_counter()
        compiled.train(until_step=3)
        compile_s = time.perf_counter() - start
        times = {"eager": [], "compiled": []}
        for _ in range(args.rounds):
            for key, trainer in (("eager", eager), ("compiled", compiled)):
                start = time.perf_counter()
                trainer.train(until_step=trainer.step + args.steps)
                times[key].append((time.perf_counter() - start) / args.steps * 1e3)
        e, c = statistics.median(times["eager"]), statistics.median(times["compiled"])
        saved = (e - c) / 1e3
        pays = f"{compile_s / saved:.0f} steps" if saved > 0 else "never"
        print(f"{name:<22}{e:>10.0f}{c:>13.0f}{e / c:>10.2f}{compile_s:>11.1f}{pays:>12}", flush=True)


if __name__ == "__main__":
    main()
