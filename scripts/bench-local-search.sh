#!/usr/bin/env bash
# local_search quality on SciFact (../shared/data/scifact): nDCG@10 of our BM25 index on the
# train qrels, printed next to BEIR's BM25 anchor (0.665, reported on the test split).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA="${SHARED_DATA:-$ROOT/../shared/data}/scifact"
cd "$ROOT"
cargo build -q --release -p orchestrator
dir="$(mktemp -d)"; trap 'rm -rf "$dir"' EXIT
./target/release/orchestrator index build --corpus "$DATA/corpus.jsonl" --out "$dir/idx"
line="$(./target/release/orchestrator index eval --index "$dir/idx" --queries "$DATA/queries.jsonl" --qrels "$DATA/qrels_train.tsv" --k 10)"
echo "$line"
ours="$(sed -E 's/^nDCG@10 = ([0-9.]+).*/\1/' <<<"$line")"
awk -v o="$ours" 'BEGIN { printf "reference BEIR BM25 (test split) = 0.665; ours / reference = %.3f\n", o / 0.665 }'
