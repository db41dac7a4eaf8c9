#!/usr/bin/env bash
# The study of docs/findings.md, with the product's own commands only. Every table and figure
# there comes out of the directories below (each holds a run store; `evo-attention report DIR`
# rebuilds its outputs). About 55 minutes on a 2-core CPU with WORKERS=2 (2026-11-24: AMD EPYC
# with AVX512-BF16): the searches 25, validation, ablation and corpus 18, transfer 8, cost 3.
#
#   bash benchmarks/findings.sh                 # everything
#   bash benchmarks/findings.sh search validate # only some stages, in this order:
#                                               # search validate ablate transfer corpus cost report
# Settings: OUT (default runs/findings), DATA (default ../shared/data), WORKERS (default 2),
# STRATEGIES (default "ga random tpe": the searches the search stage runs).
set -euo pipefail

OUT=${OUT:-runs/findings}
DATA=${DATA:-../shared/data}
WORKERS=${WORKERS:-2}
STAGES=${*:-search validate ablate transfer corpus cost report}
STRATEGIES=${STRATEGIES:-ga random tpe}
# the CPU-sized WikiText-2 setting: the quick preset's GA (8 x 4, 2 elites, 400 steps) with a
# 64-dim 2-layer model, 5000 words, 64 tokens of context
SMALL=(--preset quick --config benchmarks/wikitext_small.yaml --data-dir "$DATA/wikitext-2" --workers "$WORKERS")
# every stage after the search measures on the whole validation split (the search's fitness reads
# its first 10 batches, 40960 tokens, to be cheap)
WHOLE=(--eval-steps all --workers "$WORKERS" --quiet)
# the efficient families at this size (compare's definitions: window max_seq_len/4, GQA n_heads/2)
BASELINE="dot|softmax|none|fixed|bias|0.10"
FAMILY=("dot|linear|none|fixed|bias|0.10" "dot|favor|none|fixed|bias|0.10" "$BASELINE|win=16" "$BASELINE|kvh=2")
FAMILIES=$(IFS=,; echo "${FAMILY[*]}")
# the original study's claims: its winner (sparsemax + output gate) and its worst gating (highway)
ORIGINAL="dot|sparsemax|output_gate|learned|bias|0.10,dot|softmax|highway|fixed|bias|0.10"

stage() { [[ " $STAGES " == *" $1 "* ]]; }

if stage search; then
  # 1. three strategies, the same budget (26 trainings + the baseline each), two objectives
  for strategy in $STRATEGIES; do
    evo-attention search "${SMALL[@]}" --strategy "$strategy" --objectives perplexity,flops \
      --out "$OUT/search-$strategy" --overwrite --quiet
  done
fi

if stage validate; then
  # 2. the GA's two best genes, and random search's and TPE's best, against the baseline on 5
  # fresh seeds (seed+1 .. seed+5)
  evo-attention validate --from-run "$OUT/search-ga" --top 2 --seeds 5 "${WHOLE[@]}"
  for strategy in random tpe; do
    evo-attention validate --from-run "$OUT/search-$strategy" --top 1 --seeds 5 "${WHOLE[@]}"
  done
  # the efficient families against the same baseline (cached in the GA run's store)
  evo-attention validate --from-run "$OUT/search-ga" --genes "$FAMILIES" --seeds 5 "${WHOLE[@]}" \
    --out "$OUT/families"
  evo-attention validate --from-run "$OUT/search-ga" --genes "$ORIGINAL" --seeds 5 "${WHOLE[@]}" --out "$OUT/original"
fi

if stage ablate; then
  # the GA's best gene, one component at a time back to the baseline's, 3 seeds
  evo-attention ablate --from-run "$OUT/search-ga" --seeds 3 "${WHOLE[@]}"
fi

if stage transfer; then
  # 3. the GA's best gene and the baseline at two larger sizes, in both blocks, 2 seeds
  for block in gpt2 llama; do
    evo-attention transfer --from-run "$OUT/search-ga" --top 1 --sizes 96x2,128x3 --seeds 2 --block "$block" \
      "${WHOLE[@]}" --out "$OUT/transfer-$block"
  done
fi

if stage corpus; then
  # 4. the GA's two best genes on Shakespeare at the byte level, compared in bits per byte
  evo-attention validate --from-run "$OUT/search-ga" --top 2 --seeds 3 --data text --data-dir "$DATA/shakespeare" \
    --tokenizer byte --vocab-size full --metric bits_per_byte "${WHOLE[@]}" --out "$OUT/shakespeare-byte"
fi

if stage cost; then
  # 5. training time and memory against the context length, of the baseline, each strategy's best
  # gene (each distinct gene once) and the families: one process, 15 timed steps each; run this
  # stage with nothing else running, it times
  best() { evo-attention status "$OUT/search-$1" --json | python -c 'import json, sys; print(json.load(sys.stdin)["best"]["gene"])'; }
  GENES="baseline=$BASELINE"
  for strategy in ga random tpe; do
    gene=$(best "$strategy")
    [[ ",$GENES," == *"=$gene,"* ]] || GENES="$GENES,$strategy=$gene"
  done
  GENES="$GENES,linear=${FAMILY[0]},favor=${FAMILY[1]},window=${FAMILY[2]},gqa=${FAMILY[3]}"
  evo-attention bench --config benchmarks/wikitext_small.yaml --data-dir "$DATA/wikitext-2" --seq-lens 64,256,1024 \
    --steps 15 --genes "$GENES" --out "$OUT/cost"
fi

if stage report; then
  for dir in "$OUT"/search-*; do
    evo-attention report "$dir" >/dev/null  # rebuilds every output of the run from its store
  done
  # the three strategies side by side: best perplexity per training spent, fronts in one box
  evo-attention report "$OUT"/search-ga "$OUT"/search-random "$OUT"/search-tpe --out "$OUT/strategies" >/dev/null
fi
echo "done: $OUT"
