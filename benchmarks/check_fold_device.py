"""Same trial, same result on a device: trials trained folded into one batch against each alone.

Trains K trials of each gene (seeds and rates differing, model dropout and attention dropout on)
once through ``run_batched`` (one engine step for all K) and once each through ``run_training``, on
the device given, and writes the largest relative difference of the final validation loss and of
any point of the loss curve per gene, with the device, precision and torch version. On a CPU the
tests hold these to bitwise equality (the vanilla gene) or ``trainer.SAME_RESULT_RTOL``; this
script is how the claim is checked where the tests cannot run (a GPU). ``--dropout-stream counter``
computes every mask on the device (``dropout_stream: counter``). ``--against-cpu`` also trains each
trial alone on the CPU and writes the device's difference from it (``cpu_val_loss_rel``,
``cpu_curve_rel``): the same trial gets the same masks on both (drawn on the CPU, or the counter
stream's same bits), so what differs is the devices' rounding. ``--mixed`` adds one batch of
different genes (four classic genes and two programs, one gene twice: ``nn.fold.Split``), each
against its training alone.

    python benchmarks/check_fold_device.py --device cuda --out docs/results/gpu/fold-h100.json
    python benchmarks/check_fold_device.py --device cuda --dropout-stream counter --against-cpu --out fold.json
    python benchmarks/check_fold_device.py --device cuda --mixed --out fold-mixed.json
    python benchmarks/check_fold_device.py --device cpu --steps 8 --out /tmp/fold-cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from evo_attention import Config
from evo_attention.data import data_from_config
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import SAME_RESULT_RTOL, run_batched, run_training

GENES = ("dot|softmax|none|fixed|bias|0.10", "dot|softmax|output_gate|learned", "cosine|sigmoid|none|adaptive",
         "dot|softmax|none|fixed|abias=rel|win=4")
# one batch of different attentions around the same model (no learned position table)
MIXED = ("multiplicative|sparsemax|input_gate|learned|nobias|0.00|pos=rope|kvh=1|dconv=3",
         "additive|relu_norm|output_gate|adaptive|bias|0.10|pos=rope:ntk:4|win=3",
         "cosine|sigmoid|highway|fixed|nobias|0.00|pos=alibi|abias=rel",
         "dot|entmax15|none|learned|bias|0.10|pos=none|rank=4|kvh=2|dconv=2",
         "prog=o(sgate(mix(w.softmax(t.learned(s.dot(dconv3(q),lfeat(k)))),scale(v))))|pos=rope|kvh=2",
         "prog=g.highway(o(add(decay(v),mix(w.none(sdecay(s.additive(q,k))),bias(shift(v))))))|nobias|0.00|pos=alibi",
         "multiplicative|sparsemax|input_gate|learned|nobias|0.00|pos=rope|kvh=1|dconv=3")
SMALL = dict(data="recall", vocab_size=32, max_seq_len=32, recall={"num_pairs": 4, "train_examples": 2000,
                                                                   "eval_examples": 200},
             d_model=32, n_heads=4, n_layers=2, dropout=0.1, batch_size=16, eval_batch_size=100, eval_steps=None,
             learning_rate=2e-3, log_every=10)


def gaps(batched, alone) -> dict:
    val = abs(batched.val_loss - alone.val_loss) / abs(alone.val_loss)
    curve = max((abs(x - y) / abs(y) for (_, x), (_, y) in zip(batched.curve, alone.curve)), default=0.0)
    return {"val_loss_rel": val, "curve_rel": curve, "bitwise": batched.val_loss == alone.val_loss
            and batched.curve == alone.curve, "batched": batched.extra.get("batched"),
            "fallback": batched.extra.get("batch_fallback")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--models", type=int, default=3)
    p.add_argument("--dropout-stream", default="cpu", choices=["cpu", "counter"])
    p.add_argument("--against-cpu", action="store_true", help="also train each trial alone on the CPU")
    p.add_argument("--mixed", action="store_true", help="also one batch of different genes (MIXED)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    config = Config(**SMALL, train_steps=args.steps, precision=args.precision, device=args.device,
                    dropout_stream=args.dropout_stream)
    data = data_from_config(config)
    rows, start = [], time.perf_counter()
    batches = [[Trial.from_config(gene, config.replace(seed=s, learning_rate=2e-3 * (1 + s)), data=data)
                for s in range(args.models)] for gene in GENES]
    if args.mixed:
        batches.append([Trial.from_config(gene, config.replace(seed=s, learning_rate=2e-3 * (1 + s % 3)), data=data)
                        for s, gene in enumerate(MIXED)])
    for trials in batches:
        batched = run_batched(trials, data)
        alone = [run_training(t, data) for t in trials]
        for b, a in zip(batched, alone):
            rows.append({"gene": a.record.gene, "seed": a.record.seed, **gaps(b.record, a.record)})
        if args.against_cpu:
            for row, t, a in zip(rows[-len(trials):], trials, alone):
                cpu = run_training(t.replace(train=t.train.replace(device="cpu")), data).record
                versus = gaps(a.record, cpu)
                row.update(cpu_val_loss_rel=versus["val_loss_rel"], cpu_curve_rel=versus["curve_rel"],
                           cpu_bitwise=versus["bitwise"])
    out = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
           "torch": torch.__version__, "precision": args.precision, "steps": args.steps, "models": args.models,
           "rtol_of_the_tests": SAME_RESULT_RTOL[args.precision], "seconds": time.perf_counter() - start,
           "dropout_stream": args.dropout_stream, "command": " ".join(["python", *sys.argv]), "rows": rows,
           "largest_rel": max(max(r["val_loss_rel"], r["curve_rel"]) for r in rows)}
    if args.against_cpu:
        out["largest_cpu_rel"] = max(max(r["cpu_val_loss_rel"], r["cpu_curve_rel"]) for r in rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    for r in rows:
        print(f"{r['gene']:40s} seed {r['seed']}: val {r['val_loss_rel']:.2e} curve {r['curve_rel']:.2e}"
              f"{' bitwise' if r['bitwise'] else ''}{' (alone: ' + r['fallback'] + ')' if r['fallback'] else ''}")
    print(f"largest relative difference {out['largest_rel']:.2e} (tests' bound on a CPU {out['rtol_of_the_tests']})")
    if args.against_cpu:
        print(f"largest relative difference from the CPU {out['largest_cpu_rel']:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
