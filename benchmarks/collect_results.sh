#!/usr/bin/env bash
# Copy a study's small results from its run directory into the docs, each at its path under the run
# directory, and regenerate the docs' tables from them (run from the repository's root): its JSON
# files and each search's evaluations.csv (every evaluation in order: what a later analysis of a
# search reads once its store is gone).
#   bash benchmarks/collect_results.sh OUT DEST      e.g. runs/findings2 docs/findings
set -euo pipefail
out=$1 dest=$2
mkdir -p "$dest"
# results only: no saved model (its config and the vocabulary beside it are built from a corpus)
find "$out" \( -name '*.json' -o -name evaluations.csv \) -not -path '*/models/*' -not -path '*/model/*' \
  -not -path '*/checkpoints/*' -not -name vocab.json -not -name tokenizer.json -size -2M | while read -r f; do
  target="$dest/${f#"$out"/}"
  mkdir -p "$(dirname "$target")" && cp "$f" "$target"
done
python3 benchmarks/doc_tables.py
