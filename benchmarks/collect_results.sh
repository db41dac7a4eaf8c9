#!/usr/bin/env bash
# Copy a study's small JSON results from its run directory into the docs, each at its path under the
# run directory, and regenerate the docs' tables from them (run from the repository's root).
#   bash benchmarks/collect_results.sh OUT DEST      e.g. runs/findings2 docs/findings
set -euo pipefail
out=$1 dest=$2
mkdir -p "$dest"
# results only: no saved model (its config and the vocabulary beside it are built from a corpus)
find "$out" -name '*.json' -not -path '*/models/*' -not -path '*/model/*' -not -path '*/checkpoints/*' \
  -not -name vocab.json -not -name tokenizer.json -size -2M | while read -r f; do
  target="$dest/${f#"$out"/}"
  mkdir -p "$(dirname "$target")" && cp "$f" "$target"
done
python3 benchmarks/doc_tables.py
