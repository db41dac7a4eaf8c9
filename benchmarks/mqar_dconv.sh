#!/usr/bin/env bash
# MQAR at 8 and 16 pairs, 64 tokens, the quick model (64-dim, 2 layers): softmax with and without dconv=3,
# 10 seeds, 1,000 steps, no dropout (docs/tasks.md, issue "tasks that decide in hundreds of steps").
# Writes runs/mqar-dconv/curve.json (its store keeps every training: a repeat trains nothing) and
# copies the result to docs/results/mqar-dconv/curve.json.
set -euo pipefail
out=${1:-runs/mqar-dconv}
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} evo-attention curve --preset quick --data mqar:seq_len=64,vocab=64 \
  --seq-len 64 --vocab-size 64 --knob pairs=8,16 --dropout 0 --steps 1000 --seeds 10 \
  --genes "dot|softmax|none|fixed|bias|0.00,dot|softmax|none|fixed|bias|0.00|dconv=3" --out "$out" --quiet
mkdir -p docs/results/mqar-dconv
cp "$out/curve.json" docs/results/mqar-dconv/curve.json
