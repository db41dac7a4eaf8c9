#!/usr/bin/env bash
# A stage longer than one call of a lent GPU machine (at most 10 minutes a call): `start` runs the
# command in a process session of its own, which outlives the call while the machine stays warm;
# `wait` waits for it at most SECONDS, then copies its log into OUT with a tar of the named paths
# (results.tar.gz; each run store in it copied through SQLite's backup, so a store a live job writes
# arrives whole, holding every training finished so far: running the stage again trains only the
# rest) and progress.txt (each store's finished trainings and its workers' steps). A second `wait`,
# called at once, picks the same job up where the first left it.
#
#   JOB=DIR bash benchmarks/detached.sh start COMMAND...
#   JOB=DIR OUT=DIR bash benchmarks/detached.sh wait SECONDS [PATH...]
#
# `wait` exits 0 when the command ended with status 0, 3 while it still runs, else the command's status.
# The command's own output must lie outside the device tool's $OUT, which each call empties (a
# store there is unlinked under the running job): give a study its own out (the plan's `out`, e.g.
# runs/findings3). A lent machine's recipe for one of study 3's GPU stages (docs/findings3/study3.yaml;
# the plan adds its gpu_flags to a `device: gpu` stage where CUDA is present):
#
#   export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 EVO_ATTENTION_CACHE_DIR=$(mktemp -d)
#   mkdir -p /tmp/bin; printf '#!/bin/sh\nexec python3 -m evo_attention.cli "$@"\n' > /tmp/bin/evo-attention
#   chmod +x /tmp/bin/evo-attention; export PATH=/tmp/bin:$PATH; nvidia-cuda-mps-control -d
#   JOB=/tmp/d4 bash benchmarks/detached.sh start evo-attention study run docs/findings3/study3.yaml \
#     --stage d4-tune --stage d4-tune-matched --set data=.devdata --set workers=24
#   JOB=/tmp/d4 bash benchmarks/detached.sh wait 540 runs/findings3/d4-tune   # again in the next call if 3
#
# (DATA: a copy of ../shared/data/wikitext-2 under .devdata/, which the call carries.) The results
# come back in the tar; `study run` again on this machine copies them into docs/findings3/ and trains
# nothing that finished (its stores resume).
set -uo pipefail
JOB=${JOB:?JOB: the job directory (its log and exit status)}
verb=${1:?start or wait}
shift
mkdir -p "$JOB"

# results.tar.gz and progress.txt of the named paths (see the header); a path that does not exist yet
# is left out
snapshot() {
  local copy
  copy=$(mktemp -d)
  python3 - "$copy" "$OUT/progress.txt" "$@" <<'PY'
import shutil, sys, time
from pathlib import Path

try:
    from evo_attention.search.store import RunStore
except ImportError:
    sys.exit("detached.sh wait: evo_attention cannot be imported: install the package or set PYTHONPATH=src")

copy, progress, paths = Path(sys.argv[1]), Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]]
lines = [time.strftime("at %Y-%m-%dT%H:%M:%SZ", time.gmtime())]
for top in paths:
    if top.is_absolute():
        sys.exit(f"detached.sh wait: {top} is absolute: name the paths relative to the working directory")
    for src in ([top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []):
        if src.is_dir() or src.name.endswith(("-wal", "-shm")):
            continue
        if src != RunStore.db_path(src.parent):  # not a run store: copied as it is
            (copy / src).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, copy / src)
            continue
        with RunStore.open(src.parent, readonly=True) as live:
            live.backup(copy / src.parent)
        with RunStore.open(copy / src.parent, readonly=True) as kept:
            lines.append(f"{src}: {len(kept.evaluations())} trainings finished")
            lines += [f"  {a['worker']} step {a['step']}/{a['total']} at {a['updated_at']}" for a in kept.activity()]
progress.write_text("\n".join(lines) + "\n")
PY
  [[ $? == 0 ]] || { rm -rf "$copy"; echo "detached.sh wait: no snapshot of $* (the error above)" >&2; return 2; }
  local kept=()
  for p in "$@"; do [[ -e $copy/$p ]] && kept+=("$p"); done
  (( ${#kept[@]} )) && tar czf "$OUT/results.tar.gz" -C "$copy" "${kept[@]}"
  rm -rf "$copy"
}

case $verb in
  start)
    (( $# )) || { echo "detached.sh start: name the command to run" >&2; exit 2; }
    [[ -e $JOB/pid ]] && { echo "detached.sh: $JOB already holds a job: wait for it or use another JOB" >&2; exit 2; }
    setsid bash -c '"$@"; echo $? > "$0/rc"' "$JOB" "$@" > "$JOB/log" 2>&1 < /dev/null &
    echo $! > "$JOB/pid"
    echo "started $* (pid $!)" ;;
  wait)
    limit=${1:?wait SECONDS}
    shift
    OUT=${OUT:?OUT: where the log and the results go}
    end=$((SECONDS + limit))
    while [[ ! -e $JOB/rc ]] && (( SECONDS < end )); do sleep 5; done
    cp "$JOB/log" "$OUT/job.log"
    if (( $# )); then snapshot "$@" || exit 2; fi
    if [[ ! -e $JOB/rc ]]; then echo "still running after ${limit} s (log: job.log)"; exit 3; fi
    rc=$(cat "$JOB/rc")
    echo "ended with status $rc"
    exit "$rc" ;;
  *) echo "detached.sh: unknown verb $verb (start or wait)" >&2; exit 2 ;;
esac
