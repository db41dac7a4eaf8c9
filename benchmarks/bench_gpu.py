"""GPU throughput, one command: seconds per training step, trainings per hour and peak memory of K
models folded into one batch, per config, precision and dropout, on whatever device is there.

What it measures, for each config of ``--configs`` (``quick``: the preset, the recall task, 64 dims,
32 tokens, 400 steps; ``wikitext_small``: benchmarks/wikitext_small.yaml on top of the quick preset,
WikiText-2, vocabulary 5000, 64 tokens; ``seed``: the original experiment, WikiText-2, vocabulary
10000, 128 dims, 128 tokens, 5000 steps; the two WikiText-2 configs need ``--data-dir`` and are
skipped, with a note in the JSON, without it):

- K = 1, 4, 16, 64 (``--ks``) trials of one gene (``--gene``, default the vanilla
  ``dot|softmax|none|fixed``, seeds 0..K-1) trained by one ``Trainer`` (K > 1: the models folded
  into one batch, one optimizer step for all; ``trainer.step_seconds``), eager (compile off: what
  ``compile auto`` gives on CUDA), at each precision of ``--precisions`` the device supports (bf16
  on CUDA where ``torch.cuda.is_bf16_supported()``; on a CPU always, native or not, which the JSON
  says). Each measurement builds a fresh trainer, trains ``--warmup`` untimed steps and times
  ``--steps`` more; the measurements run in ``--rounds`` interleaved rounds (each round: each
  precision, in an order rotating per round, and for it each K in turn) and the median over rounds
  is reported:
  ``seconds_per_step`` (one step of all K models), ``trainings_per_hour`` at the config's own budget
  (``K * 3600 / (seconds_per_step * train_steps)``: training steps only, building and evaluation
  excluded), ``tokens_per_s`` and ``peak_memory_mb`` (CUDA: ``torch.cuda.max_memory_allocated``
  since a reset right before the trainer was built, so the models, optimizer state and the steps'
  activations of that K alone; elsewhere the process's resident-set peak, ``peak_memory_mb``, after
  a reset of it: it includes the process's own baseline). A K that runs out of memory is recorded
  as ``oom`` and the larger K at that precision are skipped.
- the dropout path: the same config with model dropout 0.1 against model dropout 0 (the masks are
  drawn on the CPU from each model's seeded generator and copied to the device: nn/dropout.py), and,
  when the gene has attention dropout (the vanilla gene's is 0.10, which also draws its [K*B, H, T,
  T] masks on the CPU and keeps attention off the fused kernel), no dropout at all (the gene's
  attention dropout 0 as well); beside them the same arms on the counter stream (``dropout 0.1
  counter``, ``dropout 0 counter``: ``dropout_stream: counter``, every mask a hash computed on the
  device, nothing drawn on the CPU or copied); at K = 1 and the largest K that fit
  (``--dropout-ks``, ``max``: the largest K measured without running out of memory), at bf16 where
  it was measured, else the first precision; interleaved rounds as above.
- the device (``torch.cuda.get_device_name``), torch, CUDA and cuDNN versions, threads, and the
  command line.

The result is ONE JSON file (``--out``, default gpu.json), rewritten atomically (a temporary file,
then a rename) after every measurement, so a run killed by its time limit still leaves what it
measured; ``--time-limit S`` stops starting new measurements after S seconds and marks the rest
``skipped: time limit``. A short table is printed at the end.

The K sweep trains each config as it is: its own model dropout (quick and wikitext_small 0, seed
0.1) and the gene's attention dropout (0.10 for the vanilla gene), masks from ``--dropout-stream``
(default cpu: drawn on the CPU; counter: computed on the device).

JSON layout: ``command``, ``started``, ``updated``, ``elapsed_s``, ``complete`` (false while running
and after the time limit), ``device`` (``name``, ``device``, ``type``, ``torch``, ``cuda``,
``cudnn``, ``capability``, ``total_memory_mb``, ``bf16_supported``, ``threads``,
``interop_threads``, ``omp_num_threads``, ``cores``, ``cpu``, ``cpu_bf16_native``, ``python``,
``evo_attention``), ``settings`` (the options), ``notes`` (what each number is), ``configs`` (name ->
``status``, the config's shape and budget, and with ``--auto`` ``batch_models_auto``: the K that
``batch_models auto`` chose on this device, its reason with the probe's times, and the probe's
seconds), ``rows`` (the K sweep: one per config, K and
precision), ``dropout_rows`` (one per config, K and ``arm``) and ``dropout`` (per config and K: the
arms' ``seconds_per_step`` and ``ratio_dropout_vs_0``, ``ratio_attention_dropout_vs_none``, and
``ratio_counter_vs_cpu``: per arm with masks, the counter arm's time over the CPU-drawn one's). A row:
``config``, ``k``, ``precision``, ``status`` (``ok``, ``oom``, ``error``, ``pending``, ``skipped:
...``), ``rounds``, ``round_seconds``, ``seconds_per_step``, ``ms_per_step``,
``trainings_per_hour``, ``tokens_per_s``, ``peak_memory_mb``, ``dropout``.

On a GPU (the CUDA device is the default; the defaults make about 125 measurements over the three
configs, so give a time limit that fits the machine's budget)::

    python benchmarks/bench_gpu.py --data-dir DATA --out docs/results/gpu/h100.json [--time-limit 420]

where DATA holds WikiText-2's train.txt, valid.txt and test.txt (e.g. ../shared/data/wikitext-2;
read from there, never downloaded).
On the CPU, a smoke run of a few seconds (d_model 16, 1 layer, K 1 and 2, 1 round of 1 step, quick
only; the numbers mean nothing)::

    python benchmarks/bench_gpu.py --smoke --out /tmp/gpu-smoke.json

Only torch and this project are imported (no entmax: the vanilla gene's softmax needs none).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch

from evo_attention.data import data_from_config
from evo_attention.genes import AttentionGene
from evo_attention.train.batching import models_per_batch
from evo_attention.train.environment import (cpu_has_fast_bf16, cpu_name, is_oom, peak_memory_mb, release_free_memory,
                                             reset_peak_memory, resolve_device)
from evo_attention.train.presets import build_config
from evo_attention.train.spec import DROPOUT_STREAMS, Trial
from evo_attention.train.trainer import step_seconds
from evo_attention.util.version import __version__

HERE = Path(__file__).resolve().parent
CONFIGS = ("quick", "wikitext_small", "seed")
PRECISIONS = ("fp32", "bf16")
VANILLA = "dot|softmax|none|fixed"
DROPOUT = 0.1  # the model dropout the dropout path is timed at
FORMAT = 1  # the JSON layout's version
TRAININGS_PER_HOUR = ("K * 3600 / (seconds_per_step * train_steps), train_steps the config's own budget: "
                      "training steps only; building the models and evaluation excluded")
SMOKE = {"d_model": 16, "n_heads": 2, "n_layers": 1}  # --smoke: model size (and a small recall task, below)
SMOKE_RECALL = {"num_pairs": 4, "train_examples": 500, "eval_examples": 20}
NO_DATA = "skipped: no --data-dir given (WikiText-2)"
DEFAULTS = {"configs": list(CONFIGS), "ks": [1, 4, 16, 64], "rounds": 3, "steps": 5, "warmup": 2}
SMOKE_DEFAULTS = {"configs": ["quick"], "ks": [1, 2], "rounds": 1, "steps": 1, "warmup": 1, "device": "cpu"}


# -- settings ----------------------------------------------------------------------------------------
def csv_list(text: str) -> list[str]:
    return [part.strip() for part in str(text).split(",") if part.strip()]


def csv_ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 1, got {text!r}")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", type=csv_list,
                        help=f"comma-separated, of {','.join(CONFIGS)} (default all; --smoke: quick)")
    parser.add_argument("--data-dir", help="WikiText-2 directory (train/valid/test.txt): wikitext_small and seed "
                                           "are skipped without it")
    parser.add_argument("--ks", type=csv_ints, help="models per step (default 1,4,16,64; --smoke: 1,2)")
    parser.add_argument("--precisions", type=csv_list, default=["fp32", "bf16"],
                        help="comma-separated, of fp32,bf16 (default fp32,bf16; those the device lacks are "
                             "skipped)")
    parser.add_argument("--dropout-ks", type=csv_list, default=["1", "max"],
                        help="the K of the dropout comparison: numbers or max, the largest K that fit (default 1,max)")
    parser.add_argument("--dropout-stream", choices=DROPOUT_STREAMS, default="cpu",
                        help="the dropout stream of the K sweep (default cpu: masks drawn on the CPU and copied; "
                             "counter: computed on the device); the dropout comparison times both")
    parser.add_argument("--gene", default=VANILLA, help=f"the gene every model trains (default {VANILLA})")
    parser.add_argument("--rounds", type=int, help="interleaved rounds, median reported (default 3; --smoke: 1)")
    parser.add_argument("--steps", type=int, help="timed steps per measurement (default 5; --smoke: 1)")
    parser.add_argument("--warmup", type=int, help="untimed steps before them (default 2; --smoke: 1)")
    parser.add_argument("--device", help="default cuda if available, else cpu (--smoke: cpu)")
    parser.add_argument("--time-limit", type=float, metavar="S",
                        help="start no measurement after S seconds; the rest is marked 'skipped: time limit'")
    parser.add_argument("--smoke", action="store_true",
                        help="a CPU smoke run of seconds: d_model 16, 1 layer, K 1,2, 1 round of 1 step after 1, quick "
                             "only (options given explicitly still apply)")
    parser.add_argument("--auto", action="store_true",
                        help="also record, per config, the K that batch_models auto chooses on this device (its "
                             "probe, run once per config before the sweep, kept in EVO_ATTENTION_CACHE_DIR)")
    parser.add_argument("--out", default="gpu.json", help="the JSON result file (default gpu.json)")
    args = parser.parse_args(argv)
    defaults = SMOKE_DEFAULTS if args.smoke else DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in args.configs:
        if name not in CONFIGS:
            parser.error(f"unknown config {name!r}: choose from {', '.join(CONFIGS)}")
    for p in args.precisions:
        if p not in PRECISIONS:
            parser.error(f"unknown precision {p!r}: choose from {', '.join(PRECISIONS)}")
    for k in args.dropout_ks:
        if k != "max" and not (k.isdigit() and int(k) >= 1):
            parser.error(f"--dropout-ks takes whole numbers >= 1 or max, not {k!r}")
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--rounds and --steps must be >= 1, --warmup >= 0")
    args.ks = sorted(set(args.ks))
    args.configs = list(dict.fromkeys(args.configs))
    args.precisions = list(dict.fromkeys(args.precisions))
    try:
        args.gene = AttentionGene.parse(args.gene)
    except ValueError as exc:
        parser.error(f"--gene: {exc}")
    return args


def make_config(name: str, data_dir: str | None, smoke: bool):
    """The config ``name`` as a search would run it (eager: compile off, what auto gives on CUDA)."""
    overrides = {"compile": "off"}
    if smoke:
        overrides.update(SMOKE, recall=SMOKE_RECALL)
    if name == "quick":
        return build_config("quick", overrides=overrides)
    if name == "wikitext_small":
        return build_config("quick", HERE / "wikitext_small.yaml", overrides={"data_dir": data_dir, **overrides})
    return build_config("seed", overrides={"data_dir": data_dir, **overrides})


def device_info(device: torch.device) -> dict:
    info = {"device": str(device), "type": device.type, "torch": torch.__version__, "cuda": torch.version.cuda,
            "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cores": os.cpu_count(), "cpu": cpu_name(),
            "cpu_bf16_native": cpu_has_fast_bf16(), "python": platform.python_version(),
            "evo_attention": __version__}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=torch.cuda.get_device_name(device), capability=f"{props.major}.{props.minor}",
                    total_memory_mb=props.total_memory / 2**20, cudnn=torch.backends.cudnn.version(),
                    bf16_supported=torch.cuda.is_bf16_supported())
    else:
        info.update(name=cpu_name() if device.type == "cpu" else device.type, cudnn=None, bf16_supported=True)
    return info


def unsupported(precision: str, device: torch.device) -> str | None:
    """Why ``device`` cannot train at ``precision`` (None: it can)."""
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU does not support bf16"
    return None


# -- one measurement ---------------------------------------------------------------------------------
def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        release_free_memory()


def measure(gene: AttentionGene, config, data, k: int, *, device: torch.device, warmup: int, steps: int) -> dict:
    """One fresh trainer of ``k`` trials of ``gene`` (seeds 0..k-1): ``warmup`` untimed steps, then
    ``steps`` timed. ``{"seconds", "peak_memory_mb", "precision", "compiled", "cuda_graph"}`` (how its
    steps ran on CUDA, None elsewhere: ``Trainer.graph_state``), or ``{"oom": text}``
    (out of memory), or ``{"error": text}`` (any other failure; its traceback goes to stderr)."""
    cfg = config.replace(train_steps=warmup + steps, log_every=warmup + steps)
    free_memory(device)
    reset_peak_memory(device)
    failed = None
    try:
        trials = [Trial.from_config(gene, cfg, seed=s, data=data) for s in range(k)]
        trainer, seconds = step_seconds(trials, data, device=device, warmup=warmup, steps=steps)
        out = {"seconds": seconds, "peak_memory_mb": peak_memory_mb(device), "precision": trainer.precision,
               "compiled": bool(trainer.compiled), "cuda_graph": trainer.graph_state()}
    except Exception as exc:  # noqa: BLE001 - out of memory is a result; any other failure is kept, not fatal
        text = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        if is_oom(exc):
            failed = {"oom": text}
        else:
            traceback.print_exc()
            failed = {"error": text}
    trainer = trials = None  # the traceback's frames are gone too: the memory can be freed
    if failed is not None:
        free_memory(device)
        return failed
    return out


# -- the result file ---------------------------------------------------------------------------------
class Result:
    """The JSON result, rewritten atomically after every change."""

    def __init__(self, path: Path, data: dict):
        self.path, self.data = path, data

    def write(self) -> None:
        self.data["updated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.data, f, indent=1)
                f.write("\n")
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def new_row(config: str, k: int, precision: str, *, arm: str | None = None) -> dict:
    row = {"config": config, "k": k, "precision": precision}
    if arm is not None:
        row["arm"] = arm
    row.update(status="pending", rounds=0, seconds_per_step=None, ms_per_step=None, trainings_per_hour=None,
               tokens_per_s=None, peak_memory_mb=None, round_seconds=[])
    return row


def record(row: dict, measured: dict, *, budget: int, tokens_per_step: int) -> None:
    """Add one measurement to ``row`` (its median over the rounds so far)."""
    if "oom" in measured:
        row["status"], row["error"] = "oom", measured["oom"]
        return
    if "error" in measured:
        row["status"], row["error"] = "error", measured["error"]
        return
    row["round_seconds"].append(measured["seconds"])
    row["rounds"] = len(row["round_seconds"])
    seconds = statistics.median(row["round_seconds"])
    row.update(status="ok", seconds_per_step=seconds, ms_per_step=1e3 * seconds,
               trainings_per_hour=row["k"] * 3600.0 / (seconds * budget), tokens_per_s=tokens_per_step / seconds,
               peak_memory_mb=max(row["peak_memory_mb"] or 0.0, measured["peak_memory_mb"]),
               precision_run=measured["precision"], compiled=measured["compiled"],
               cuda_graph=measured.get("cuda_graph"))


def skip_pending(result: dict, why: str) -> None:
    """Mark every measurement not yet started ``why``; a row cut short says how many rounds it has."""
    rounds = result["settings"]["rounds"]
    for row in result["rows"] + result["dropout_rows"]:
        if row["status"] == "pending":
            row["status"] = why
        elif row["status"] == "ok" and row["rounds"] < rounds:
            row["note"] = f"{why}: {row['rounds']} of {rounds} rounds"
    for entry in result["configs"].values():
        if entry["status"] in ("pending", "running"):
            entry["status"] = why if entry["status"] == "pending" else "partial: " + why


def compare(config: str, k: int, precision: str, arms: dict) -> dict:
    """The dropout comparison at one K: each arm's seconds per step, and their ratios (None where an
    arm has no measurement)."""
    seconds = {arm: row["seconds_per_step"] for arm, row in arms.items()}
    base, with_dropout, none = seconds["dropout 0"], seconds[f"dropout {DROPOUT}"], seconds.get("no dropout")
    out = {"config": config, "k": k, "precision": precision, "seconds_per_step": seconds,
           "ratio_dropout_vs_0": with_dropout / base if base and with_dropout else None}
    if "no dropout" in arms:  # the gene's attention dropout (model dropout 0) against no dropout at all
        out["ratio_attention_dropout_vs_none"] = base / none if base and none else None
    out["ratio_counter_vs_cpu"] = {  # the same arm with masks computed on the device / drawn on the CPU
        arm: (seconds[f"{arm} counter"] / seconds[arm] if seconds[f"{arm} counter"] and seconds[arm] else None)
        for arm in seconds if f"{arm} counter" in seconds}
    return out


# -- the benchmark -----------------------------------------------------------------------------------
class OutOfTime(Exception):
    pass


def run_rounds(jobs: list[tuple], rounds: int, groups: list, run_one, check_time) -> None:
    """``rounds`` interleaved rounds over ``jobs``: in each round every group (an order rotating per
    round), and in it each of its jobs in turn. ``jobs``: ``(group, row, next_rows)``; a job whose
    row is no longer ``pending``/``ok`` is left out, and an oom or error skips ``next_rows`` (larger K)."""
    for r in range(rounds):
        shift = r % len(groups)
        for group in groups[shift:] + groups[:shift]:
            for g, row, larger in jobs:
                if g != group or row["status"] not in ("pending", "ok"):
                    continue
                check_time()
                run_one(row)
                if row["status"] in ("oom", "error"):
                    why = "ran out of memory" if row["status"] == "oom" else "failed"
                    for other in larger:
                        if other["status"] == "pending":
                            other["status"] = f"skipped: K={row['k']} {why}"


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark (``argv``: the options, default ``sys.argv[1:]``); returns the result."""
    # what exists now (modules, torch's tables) is never garbage: out of the full collections each
    # measurement starts with, which then take milliseconds instead of a tenth of a second
    gc.collect()
    gc.freeze()
    try:
        return run(argv)
    finally:
        gc.unfreeze()


def run(argv: list[str] | None) -> dict:
    start = time.perf_counter()
    args = parse_args(argv)
    device = resolve_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    deadline = None if args.time_limit is None else start + args.time_limit
    command = " ".join(shlex.quote(a) for a in [sys.executable, sys.argv[0] if argv is None else
                                                  "benchmarks/bench_gpu.py", *(sys.argv[1:] if argv is None else argv)])
    precisions = [p for p in args.precisions if unsupported(p, device) is None]
    if not precisions:
        raise SystemExit(f"none of --precisions {','.join(args.precisions)} runs on {device}: "
                         + "; ".join(unsupported(p, device) for p in args.precisions))
    result = Result(Path(args.out), {
        "benchmark": "bench_gpu", "format": FORMAT, "command": command,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "updated": None, "elapsed_s": 0.0,
        "complete": False,
        "device": device_info(device),
        "settings": {"configs": args.configs, "ks": args.ks, "precisions": precisions,
                     "precisions_skipped": {p: unsupported(p, device) for p in args.precisions
                                            if unsupported(p, device)},
                     "dropout_ks": args.dropout_ks, "dropout": DROPOUT, "gene": args.gene.key, "rounds": args.rounds,
                     "steps": args.steps, "warmup": args.warmup, "smoke": args.smoke, "time_limit_s": args.time_limit,
                     "data_dir": args.data_dir, "compile": "off", "dropout_stream": args.dropout_stream,
                     "auto": args.auto},
        "notes": {
            "seconds_per_step": "one training step of all K models (median over the rounds of the mean of --steps "
                                "timed steps, after --warmup untimed ones, each measurement a fresh trainer)",
            "trainings_per_hour": TRAININGS_PER_HOUR,
            "tokens_per_s": "K * batch_size * seq_len / seconds_per_step",
            "peak_memory_mb": ("torch.cuda.max_memory_allocated since a reset right before the trainer was built "
                               "(max over the rounds)" if device.type == "cuda" else
                               "the process's resident-set peak (VmHWM) after a reset right before the trainer was "
                               "built, baseline of the process included (max over the rounds)"),
            "dropout": "model dropout masks are drawn on the CPU from each model's seeded generator and copied to "
                       "the device (nn/dropout.py); so are attention-dropout masks (the gene's last field); the "
                       "arms named 'counter' (and the K sweep with --dropout-stream counter) compute every mask "
                       "on the device instead (dropout_stream: counter)",
        },
        "configs": {}, "rows": [], "dropout_rows": [], "dropout": [],
    })
    res = result.data
    for name in args.configs:  # the WikiText-2 configs need the corpus, never downloaded
        res["configs"][name] = {"status": "pending" if name == "quick" or args.data_dir else NO_DATA}
    out_of_time = False

    def check_time() -> None:
        if deadline is not None and time.perf_counter() >= deadline:
            raise OutOfTime

    def save() -> None:
        res["elapsed_s"] = round(time.perf_counter() - start, 2)
        result.write()

    info = res["device"]
    print(f"{info['name']} ({device}), torch {info['torch']}, CUDA {info['cuda']}, {info['threads']} threads; gene "
          f"{args.gene.key}; K {','.join(map(str, args.ks))}; {', '.join(precisions)}; {args.rounds} rounds x "
          f"{args.steps} steps after {args.warmup}", flush=True)
    save()
    try:
        for name in args.configs:
            entry = res["configs"][name]
            if entry["status"] == NO_DATA:
                continue
            check_time()
            entry["status"] = "running"
            loaded = time.perf_counter()
            try:
                config = make_config(name, args.data_dir, args.smoke).replace(dropout_stream=args.dropout_stream)
                data = data_from_config(config)
            except Exception as exc:  # noqa: BLE001 - a missing corpus, say: the other configs still run
                entry["status"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                print(f"{name}: {entry['status']}", file=sys.stderr, flush=True)
                save()
                continue
            budget = config.train_steps
            tokens = config.batch_size * data.seq_len  # per model and step
            entry.update(budget_steps=budget, data=config.data, vocab_size=data.vocab_size, seq_len=data.seq_len,
                         d_model=config.d_model, n_layers=config.n_layers, n_heads=config.n_heads,
                         batch_size=config.batch_size, dropout=config.dropout,
                         attention_dropout=args.gene.attention_dropout, data_load_s=time.perf_counter() - loaded)
            print(f"{name}: {config.data}, vocab {data.vocab_size}, {data.seq_len} tokens, {config.d_model} dims x "
                  f"{config.n_layers} layers, batch {config.batch_size}, dropout {config.dropout}, budget {budget} "
                  "steps", flush=True)
            save()

            if args.auto:  # what a user's run with batch_models auto would fold here, and the probe's times
                check_time()
                probed = time.perf_counter()
                trial = Trial.from_config(args.gene, config, seed=0, data=data)
                k, why = models_per_batch("auto", trial, data, device=device)
                entry["batch_models_auto"] = {"k": k, "why": why, "probe_s": round(time.perf_counter() - probed, 2)}
                print(f"  {name} batch_models auto: {why}", flush=True)
                save()

            # the K sweep, per precision
            rows = {(p, k): new_row(name, k, p) for p in precisions for k in args.ks}
            for row in rows.values():
                row["dropout"] = config.dropout
                res["rows"].append(row)
            save()

            def sweep_one(row, *, cfg, gene):
                m = measure(gene, cfg, data, row["k"], device=device, warmup=args.warmup, steps=args.steps)
                record(row, m, budget=budget, tokens_per_step=row["k"] * tokens)
                print(f"  {name} K={row['k']:<3} {row['precision']:<4} {row.get('arm', ''):<14} "
                      + (f"{1e3 * m['seconds']:9.2f} ms/step  peak {m['peak_memory_mb']:.0f} MB" if "seconds" in m
                         else f"{row['status']}: {row['error']}"), flush=True)
                save()

            jobs = [(p, rows[(p, k)], [rows[(p, j)] for j in args.ks if j > k]) for p in precisions for k in args.ks]
            run_rounds(jobs, args.rounds, precisions, lambda row: sweep_one(
                row, cfg=config.replace(precision=row["precision"]), gene=args.gene), check_time)

            # the dropout path at K = 1 and the largest K that fit
            dp = "bf16" if "bf16" in precisions else precisions[0]
            fit = [k for k in args.ks if rows[(dp, k)]["status"] == "ok"]
            dks = sorted({(max(fit) if fit else None) if k == "max" else int(k) for k in args.dropout_ks} - {None})
            cpu, counter = config.replace(dropout_stream="cpu"), config.replace(dropout_stream="counter")
            arms = {"dropout 0": (cpu.replace(dropout=0.0, precision=dp), args.gene),
                    f"dropout {DROPOUT}": (cpu.replace(dropout=DROPOUT, precision=dp), args.gene),
                    f"dropout {DROPOUT} counter": (counter.replace(dropout=DROPOUT, precision=dp), args.gene)}
            if args.gene.attention_dropout > 0:
                arms["dropout 0 counter"] = (counter.replace(dropout=0.0, precision=dp), args.gene)
                arms["no dropout"] = (cpu.replace(dropout=0.0, precision=dp),
                                      args.gene.replace(attention_dropout=0.0))
            drows = {}
            for k in dks:
                for arm, (cfg, gene) in arms.items():
                    row = drows[(arm, k)] = new_row(name, k, dp, arm=arm)
                    row.update(dropout=cfg.dropout, attention_dropout=gene.attention_dropout, gene=gene.key,
                               dropout_stream=cfg.dropout_stream)
                    res["dropout_rows"].append(row)
            save()
            jobs = [(arm, drows[(arm, k)], [drows[(arm, j)] for j in dks if j > k]) for arm in arms for k in dks]
            try:
                run_rounds(jobs, args.rounds, list(arms), lambda row: sweep_one(
                    row, cfg=arms[row["arm"]][0], gene=arms[row["arm"]][1]), check_time)
            finally:  # what was measured, also when the time limit stops the rounds
                for k in dks:
                    res["dropout"].append(compare(name, k, dp, {arm: drows[(arm, k)] for arm in arms}))
            entry["status"] = "ok"
            save()
    except OutOfTime:
        out_of_time = True
        print(f"time limit of {args.time_limit:g} s reached: the rest is skipped", flush=True)
        skip_pending(res, "skipped: time limit")
    res["complete"] = not out_of_time
    save()
    print_table(res)
    print(f"\nwrote {args.out} ({res['elapsed_s']:.1f} s)")
    return res


def print_table(res: dict) -> None:
    print("\n| config | K | precision | dropout | ms / step | trainings / hour | tokens / s | peak MB | status |")
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | --- |")

    def fmt(value, spec):
        return "" if value is None else format(value, spec)

    for row in res["rows"] + res["dropout_rows"]:
        status = row["status"] + (f" ({row['note']})" if row.get("note") else "")
        print(f"| {row['config']} | {row['k']} | {row['precision']} | {row.get('arm', row.get('dropout'))} | "
              f"{fmt(row['ms_per_step'], '.2f')} | {fmt(row['trainings_per_hour'], '.1f')} | "
              f"{fmt(row['tokens_per_s'], '.0f')} | {fmt(row['peak_memory_mb'], '.0f')} | {status} |")
    for name, entry in res["configs"].items():
        if entry["status"] != "ok":
            print(f"{name}: {entry['status']}")
    for c in res["dropout"]:
        ratio = c.get("ratio_dropout_vs_0")
        extra = c.get("ratio_attention_dropout_vs_none")
        if ratio is None and extra is None:
            continue
        print(f"{c['config']} K={c['k']} {c['precision']}: dropout {DROPOUT} / dropout 0 = "
              f"{fmt(ratio, '.2f') or '?'}x" + (f"; attention dropout only / none = {fmt(extra, '.2f') or '?'}x"
                                                if "ratio_attention_dropout_vs_none" in c else ""))
        counter = {arm: r for arm, r in c.get("ratio_counter_vs_cpu", {}).items() if r is not None}
        if counter:
            print(f"{c['config']} K={c['k']} {c['precision']}: counter / cpu stream = "
                  + ", ".join(f"{r:.2f}x ({arm})" for arm, r in counter.items()))


if __name__ == "__main__":
    main()
