"""The quick preset's training step alone and beside a competing 2-thread CPU job, in interleaved rounds.

    python benchmarks/bench_busy.py --out docs/results/busy/cpu.json

OpenMP's wait policy is read once, when torch loads its thread pool, so every arm runs in a
fresh process with its own environment: ``evo-attention bench --preset quick --precision fp32
--steps N --json`` (the product's own timing), with

- ``today``: the settings of evo-attention 0.4 (``EVO_ATTENTION_THREADS=off``: OpenMP's defaults);
- ``product``: what the CLI chooses now (``util.threads``: the load watch);
- any ``NAME=ENV`` given with ``--arm`` (e.g. ``--arm passive=OMP_WAIT_POLICY=PASSIVE``).

Each round times every arm idle and beside the competitor (a separate process running 2-thread
PyTorch matrix products with OpenMP's default spinning, as a second training or a test run
would), arms in an order that alternates between rounds. The competitor starts a second before
the arm and stops after it. Every arm gets a fresh probe cache directory (a probe taken under load
is never kept, but a fresh one keeps the arms alike). The result keeps each arm's ms per step per
round and condition, what each measurement's watch saw (``thread_waits``: short or long waits, the
other processes' load, switches), the median over rounds, and the ratios busy / idle and idle /
today's idle. The competitor runs before the arm starts, so the watch's first sample sees it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMPETITOR = r"""
import os, sys, time
import torch
torch.set_num_threads(2)
a = torch.randn(256, 256); b = torch.randn(256, 256)
deadline = time.time() + float(sys.argv[1])
while time.time() < deadline:
    for _ in range(50):
        a = torch.tanh(a @ b) * 0.5
"""

ARMS = {"today": {"EVO_ATTENTION_THREADS": "off"}, "product": {}}


def competitor(seconds: float) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "EVO_ATTENTION_THREADS"))}
    return subprocess.Popen([sys.executable, "-c", COMPETITOR, str(seconds)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def time_arm(env_changes: dict, steps: int, smoke: bool) -> tuple[float, str | None]:
    """ms per step of the quick preset in a fresh process with ``env_changes``, and how its OpenMP
    threads waited (``thread_waits``: what its load watch saw)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "EVO_ATTENTION_THREADS"))}
    env.update(env_changes)
    with tempfile.TemporaryDirectory() as cache:
        env["EVO_ATTENTION_CACHE_DIR"] = cache
        command = ["evo-attention", "bench", "--preset", "quick", "--precision", "fp32", "--steps", str(steps),
                   "--json"]
        if smoke:
            command += ["--d-model", "16", "--heads", "2", "--layers", "1", "--batch-size", "4"]
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"bench failed ({' '.join(command)}): {out.stderr.strip()[-400:]}")
    payload = json.loads(out.stdout)
    return float(payload["ms_per_step"]), payload.get("thread_waits")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--arm", action="append", default=[], metavar="NAME=VAR=VALUE[,VAR=VALUE]",
                        help="another arm: its name and environment")
    parser.add_argument("--smoke", action="store_true", help="tiny model, one round: checks that it runs")
    parser.add_argument("--out", help="the JSON result to write")
    args = parser.parse_args(argv)
    arms = dict(ARMS)
    for spec in args.arm:
        name, _, env = spec.partition("=")
        arms[name] = dict(part.split("=", 1) for part in env.split(",") if part)
    rounds = 1 if args.smoke else args.rounds
    times = {name: {"idle": [], "busy": []} for name in arms}
    waits = {name: {"idle": [], "busy": []} for name in arms}
    for r in range(rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for name in order:
            for condition in ("idle", "busy"):
                job = competitor(600) if condition == "busy" else None
                try:
                    if job is not None:
                        time.sleep(1.0)
                    ms, wait = time_arm(arms[name], args.steps, args.smoke)
                finally:
                    if job is not None:
                        job.kill()
                        job.wait()
                times[name][condition].append(ms)
                waits[name][condition].append(wait)
    today_idle = statistics.median(times["today"]["idle"])
    summary = {}
    for name, t in times.items():
        idle, busy = statistics.median(t["idle"]), statistics.median(t["busy"])
        summary[name] = {"idle_ms": idle, "busy_ms": busy, "busy_over_idle": busy / idle,
                         "busy_over_today_idle": busy / today_idle, "idle_over_today_idle": idle / today_idle}
    result = {"kind": "busy-machine", "preset": "quick", "precision": "fp32", "rounds": rounds, "steps": args.steps,
              "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
              "arms": arms, "ms_per_step": times, "thread_waits": waits, "summary": summary,
              "command": "python benchmarks/bench_busy.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name, s in summary.items():
        print(f"{name}: idle {s['idle_ms']:.1f} ms, beside a 2-thread job {s['busy_ms']:.1f} ms "
              f"({s['busy_over_idle']:.1f}x its idle, {s['busy_over_today_idle']:.1f}x today's idle; idle "
              f"{s['idle_over_today_idle']:.2f}x today's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
