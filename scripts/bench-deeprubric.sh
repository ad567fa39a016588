#!/usr/bin/env bash
# DeepRubric for real on the embedded defaults: the smoke SFT model (a small Qwen3 trained on
# the research world, no GPU) served by `trainer serve` is the LLM of every stage, SciFact is
# the corpus (seeds sampled from it, passages from its BM25 index). Such a model rarely writes
# the JSON the stages require, so most nodes and items fail: the counts say so. Prints wall time
# per tree and per item, LLM calls and tokens per item, and Postgres write time per tree.
#
#   DATABASE_URL       default postgres://postgres@127.0.0.1:5432/rubricem
#   DR_PROFILE         cargo profile of the binaries (release | debug; default release)
#   DR_SEEDS           seeds sampled from SciFact (default 5)
#   DR_MAX_TOKENS      completion tokens per LLM call (default 384)
#   DR_PASSAGES        passages per node and DR_PASSAGE_CHARS characters each (default 2 x 700:
#                      the small model's context is 4,096 tokens)
#   DR_PORT            port of the LLM server (default 8190)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/rubricem}"
PROFILE="${DR_PROFILE:-release}"
DATA="${SHARED_DATA:-$ROOT/../shared/data}/scifact"
PORT="${DR_PORT:-8190}"
DIR=runs/deeprubric
say() { echo "bench-deeprubric: $*" >&2; }

[[ -f runs/smoke/model-sft/model.safetensors ]] || SMOKE_PREP_ONLY=1 SMOKE_PROFILE="$PROFILE" bash scripts/smoke.sh
# shellcheck source=/dev/null
source scripts/torch-env.sh
if [[ "$PROFILE" == release ]]; then
  cargo build -q --release -p orchestrator -p trainer
  BIN=target/release
else
  cargo build -q -p orchestrator -p trainer
  BIN=target/debug
fi
"$BIN/orchestrator" migrate >/dev/null
mkdir -p "$DIR"
[[ -f "$DIR/index/meta.json" ]] || "$BIN/orchestrator" index build --corpus "$DATA/corpus.jsonl" --out "$DIR/index"

"$BIN/trainer" serve --model runs/smoke/model-sft --bind "127.0.0.1:$PORT" --threads 2 --device cpu \
  >"$DIR/llm.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.5
done
MODEL="$(curl -sf "http://127.0.0.1:$PORT/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')"
NAME="bench-$(date +%s)"
start=$(date +%s.%N)
"$BIN/orchestrator" data deeprubric --name "$NAME" --seed-corpus "$DATA/corpus.jsonl" \
  --seed-count "${DR_SEEDS:-5}" --seed 7 --index "$DIR/index" \
  --llm-url "http://127.0.0.1:$PORT" --llm-model "$MODEL" --max-tokens "${DR_MAX_TOKENS:-384}" \
  --passages "${DR_PASSAGES:-2}" --passage-chars "${DR_PASSAGE_CHARS:-700}" \
  --trees-in-flight 2 --json --out "$DIR/tasks.jsonl" | tee "$DIR/run.log"
end=$(date +%s.%N)
python3 - "$start" "$end" "$DIR/run.log" <<'PY'
import json, sys
start, end, log = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
s = json.loads(open(log).read().strip().splitlines()[-1])
wall = end - start
trees = max(s["trees"], 1)
items = s["items_composed"] + s["items_failed"]
print(f"wall {wall:.1f} s: {wall / trees:.1f} s per tree; "
      + (f"{wall / items:.1f} s per item attempted" if items else "no item reached composition"))
print(f"LLM per tree: {s['llm_calls'] / trees:.1f} calls, "
      f"{(s['prompt_tokens'] + s['completion_tokens']) / trees:.0f} tokens; "
      f"Postgres node writes per tree: {s['db_seconds_per_tree'] * 1000:.1f} ms")
if items:
    print(f"LLM per item attempted: {s['llm_calls'] / items:.1f} calls, "
          f"{(s['prompt_tokens'] + s['completion_tokens']) / items:.0f} tokens")
print(f"trees failed {s['trees_failed']} of {s['trees']}; items composed {s['items_composed']}, "
      f"failed {s['items_failed']}; KEEP {s['keep']} REVISE {s['revise']} DROP {s['drop']}")
PY
