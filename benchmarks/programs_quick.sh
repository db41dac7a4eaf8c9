#!/usr/bin/env bash
# A search over attention programs at the quick preset (recall task, 64-dim 2-layer model, 400
# steps, GA 8 x 4 generations), and random program search at the same budget (docs/programs.md).
# Copies each run's final_results.json to docs/results/programs-quick/{ga,random}/.
set -euo pipefail
out=${1:-runs/programs-quick}
config=docs/results/programs-quick/programs.yaml
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
evo-attention search --preset quick --config "$config" --out "$out/ga" --quiet
evo-attention search --preset quick --config "$config" --strategy random --out "$out/random" --quiet
for s in ga random; do
  mkdir -p docs/results/programs-quick/$s
  cp "$out/$s/final_results.json" docs/results/programs-quick/$s/final_results.json
done
