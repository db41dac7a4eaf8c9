"""Wall time of the README's first command, ``evo-attention search --preset quick``, from start to exit,
in a fresh cache directory (the precision and batch probes measured as on a new machine), with the
trainings it stored per role (``studies.results.run_times``). Run it on an otherwise idle machine.

    python benchmarks/time_quick.py --out docs/results/quick-search/time.json [-- MORE SEARCH FLAGS]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from evo_attention.studies.results import run_times
from evo_attention.train.probe_cache import cpu_name
from evo_attention.util.threads import cores


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("flags", nargs="*", help="more flags for the search (after --)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        command = ["evo-attention", "search", "--preset", "quick", "--quiet", *args.flags]
        env = {**os.environ, "EVO_ATTENTION_CACHE_DIR": str(Path(tmp) / "cache")}
        start = time.perf_counter()
        subprocess.run([*command, "--out", str(Path(tmp) / "run")], env=env, check=True)
        wall = time.perf_counter() - start
        roles = {role: r["trainings"] for role, r in run_times(Path(tmp) / "run", trainings=False)["roles"].items()}
    result = {"command": " ".join(command + ["--out", "RUN"]) + "  (EVO_ATTENTION_CACHE_DIR fresh)",
              "made_by": "python benchmarks/time_quick.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "wall_s": round(wall, 1), "trainings": roles, "total_trainings": sum(roles.values()),
              "machine": {"cpu": cpu_name(), "cores": cores(), "torch": torch.__version__},
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['wall_s'] / 60:.1f} min, {result['total_trainings']} trainings {roles}")
    return result


if __name__ == "__main__":
    main()
