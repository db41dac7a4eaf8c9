#!/usr/bin/env bash
# The GPU checks of issue 44 in one call of a lent CUDA machine (about 6 minutes on one H100):
#   bits   the counter dropout stream's masks, the same bits on the CPU and the device
#          (tests/test_dropout_counter.py; its CUDA test runs only where a device is);
#   fold   the same trial on the device and on the CPU, alone and folded, both dropout streams, fp32
#          (benchmarks/check_fold_device.py --against-cpu --mixed: what differs is the devices' rounding;
#          --mixed adds one batch of different genes);
#   bench  throughput with every mask computed on the device, and the K that batch_models auto picks
#          there (benchmarks/bench_gpu.py --dropout-stream counter --auto);
#   procs  PROCS processes (default 16) training one seed-config model each on the device at once,
#          as a search's workers do (MPS started where the machine has it): each one's seconds per
#          step over STEPS steps, their sum of steps per second, and what that makes of the seed
#          study's 94 trainings of 5000 steps (training steps only);
#   graph  a training step replayed as a CUDA graph: tests/test_cuda_graph.py (the same weights as
#          the eager training) and benchmarks/bench_graph.py (its seconds per step against eager);
#   profile  where a seed-config step spends its device time: `evo-attention bench --profile` (eager
#          operators by their CUDA time, bf16, counter stream) for each gene of PROFILE_GENES;
#   generation  a climb's first generation of different genes (nn.fold.Split) folded in batches of K
#          against one trainer per trial, at the quick preset and the seed config
#          (benchmarks/bench_generation.py: trainings per hour, extrapolated to each budget);
#   study  the seed study itself: search --preset seed on the device, STUDY_WORKERS worker processes
#          (default 12, the population) sharing it under MPS, bf16, the counter stream, stopped after
#          STUDY_LIMIT seconds (default 420; it resumes from its store with the same command), then
#          its stored times (benchmarks/store_times.py).
#
#   OUT=DIR NAME=h100 DATA=DIR/wikitext-2 [PARTS="bits fold bench procs"] bash benchmarks/gpu_checks.sh
#
# Every file lands in OUT: NAME-counter-bits.log, fold-NAME-counter.json, fold-NAME-cpu-stream.json,
# gpu-NAME-counter.json, gpu-NAME-procs.json, NAME-graph-tests.log, graph-NAME.json, profile-NAME.log,
# seed-study-NAME/ with seed-study-NAME-times.json, gpu-checks.log. A part that fails is logged and the
# next one still runs; the exit status says whether all passed. Probes run in a fresh cache
# directory (nothing measured elsewhere or under load is read); the tests run in one process
# (`-o addopts=`: no worker processes, their printed lines in the log). DEVICE=cpu runs the script itself
# on a machine without a GPU (its numbers mean nothing).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-checks}
NAME=${NAME:-gpu}
DATA=${DATA:-../shared/data/wikitext-2}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
BENCH_LIMIT=${BENCH_LIMIT:-240}  # seconds after which bench_gpu.py starts no new measurement
PARTS=${PARTS:-bits fold bench procs}
PROCS=${PROCS:-16}
STEPS=${STEPS:-300}
PROFILE_GENES=${PROFILE_GENES:-"dot|softmax|none|fixed|bias|0.10;dot|softmax|output_gate|fixed|bias|0.05;additive|softmax|input_gate|adaptive|nobias|0.10;additive|sparsemax|output_gate|learned|bias|0.25"}
STUDY_WORKERS=${STUDY_WORKERS:-12}
STUDY_LIMIT=${STUDY_LIMIT:-420}
STUDY_DIR=${STUDY_DIR:-$OUT/seed-study-$NAME}  # a directory outside OUT outlives the call on a warm machine
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
EVO_ATTENTION_CACHE_DIR=$(mktemp -d)
export EVO_ATTENTION_CACHE_DIR
exec > >(tee -a "$OUT/gpu-checks.log") 2>&1
failed=0
part() {  # part TITLE COMMAND...: run one check, log its time and status, go on either way
  local title=$1 start=$SECONDS
  shift
  echo "== $title ($(date -u +%H:%M:%S))"
  "$@" || { echo "!! $title failed (exit $?)"; failed=1; }
  echo "== $title: $((SECONDS - start)) s"
}
want() { [[ " $PARTS " == *" $1 "* ]]; }

procs() {  # PROCS concurrent one-model trainings of the seed config; the sum of their steps per second
  local dir i pids=()
  dir=$(mktemp -d)
  if command -v nvidia-cuda-mps-control > /dev/null && nvidia-cuda-mps-control -d; then echo "MPS started"; fi
  for i in $(seq "$PROCS"); do
    OMP_NUM_THREADS=1 "$PY" benchmarks/bench_gpu.py --device "$DEVICE" --data-dir "$DATA" --configs seed --ks 1 \
      --precisions bf16 --dropout-ks "" --dropout-stream counter --rounds 1 --warmup 20 --steps "$STEPS" \
      --out "$dir/p$i.json" > "$dir/p$i.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"  # these alone: a bare wait would wait for the log's tee too
  "$PY" benchmarks/gpu_procs_summary.py "$dir" --processes "$PROCS" --out "$OUT/gpu-$NAME-procs.json"
}

profile() {  # the operators of one eager seed-config step by device time, per gene (profile-NAME.log)
  local gene genes
  IFS=';' read -ra genes <<< "$PROFILE_GENES"
  for gene in "${genes[@]}"; do
    echo "-- $gene"
    "$PY" -m evo_attention.cli bench --preset seed --data-dir "$DATA" --device "$DEVICE" --precision bf16 \
      --dropout-stream counter --gene "$gene" --profile || return 1
  done >> "$OUT/profile-$NAME.log" 2>&1
  tail -20 "$OUT/profile-$NAME.log"
}

study() {  # the seed study on the device, stopped after STUDY_LIMIT seconds; its stored times either way
  local start=$SECONDS rc
  if command -v nvidia-cuda-mps-control > /dev/null && nvidia-cuda-mps-control -d; then echo "MPS started"; fi
  local resume=()
  [[ -e "$STUDY_DIR/run.db" ]] && resume=(--resume)  # the store of an earlier call: go on from it
  timeout "$STUDY_LIMIT" "$PY" -m evo_attention.cli search --preset seed --data-dir "$DATA" --device "$DEVICE" \
    --precision bf16 --dropout-stream counter --workers "$STUDY_WORKERS" --quiet "${resume[@]}" --out "$STUDY_DIR"
  rc=$?
  echo "seed study: exit $rc after $((SECONDS - start)) s (124: stopped by the limit)"
  "$PY" benchmarks/store_times.py "$STUDY_DIR" --out "$OUT/seed-study-$NAME-times.json"
  [[ "$STUDY_DIR" -ef "$OUT/seed-study-$NAME" ]] || cp -r "$STUDY_DIR" "$OUT/seed-study-$NAME"
  return $rc
}

command -v nvidia-smi > /dev/null && nvidia-smi -L
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())"
want bits && part "counter bits, CPU and CUDA" bash -c "'$PY' -m pytest -q -p no:cacheprovider -o addopts= -rA tests/test_dropout_counter.py \
  > '$OUT/$NAME-counter-bits.log' 2>&1; status=\$?; tail -30 '$OUT/$NAME-counter-bits.log'; exit \$status"
if want fold; then
  for stream in counter cpu; do
    part "fold and CPU, $stream stream" "$PY" benchmarks/check_fold_device.py --mixed --device "$DEVICE" --precision fp32 \
      --dropout-stream "$stream" --against-cpu --out "$OUT/fold-$NAME-${stream/cpu/cpu-stream}.json"
  done
fi
want bench && part "bench_gpu, counter stream" "$PY" benchmarks/bench_gpu.py --data-dir "$DATA" --configs quick,seed \
  --device "$DEVICE" --dropout-stream counter --ks 1,16,64,256 --precisions bf16 --dropout-ks 1,64 --rounds 2 --auto \
  --time-limit "$BENCH_LIMIT" --out "$OUT/gpu-$NAME-counter.json"
want procs && part "$PROCS processes, seed config" procs
want graph && part "CUDA graph: same weights" bash -c "'$PY' -m pytest -q -p no:cacheprovider -o addopts= -rA -s tests/test_cuda_graph.py \
  > '$OUT/$NAME-graph-tests.log' 2>&1; status=\$?; tail -30 '$OUT/$NAME-graph-tests.log'; exit \$status"
want graph && part "CUDA graph: seconds per step" "$PY" benchmarks/bench_graph.py --data-dir "$DATA" --configs quick,seed \
  --device "$DEVICE" --precisions bf16,fp32 --rounds 3 --out "$OUT/graph-$NAME.json"
want profile && part "device time of a seed-config step" profile
want generation && part "a generation of different genes folded, quick preset" "$PY" benchmarks/bench_generation.py \
  --config quick --population 16 --ks 1 4 16 --steps 30 --rounds 2 --out "$OUT/generation-$NAME-quick.json"
want generation && part "a generation of different genes folded, seed config" "$PY" benchmarks/bench_generation.py \
  --config seed --data-dir "$DATA" --population 12 --ks 1 12 --steps 10 --rounds 1 --out "$OUT/generation-$NAME-seed.json"
want study && part "seed study, $STUDY_WORKERS workers" study
exit $failed
