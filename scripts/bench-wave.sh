#!/usr/bin/env bash
# A real rollout wave, timed under each way a decode round attends (issue 25 item 4, session
# 41): `trainer serve --decode-attention masked` (libtorch's kernel over every row up to the
# longest: the reference) and `auto` (each row reads only its own positions where that pays),
# one after the other on the same model, tasks, tool index and seed, so both generate the same
# attempts up to float rounding. Prints per mode the wall time of `orchestrator rollout`, the
# tokens generated and their rate, the server's prefill and decode seconds, and the share of
# cached positions a masked round reads that the rows need (from `/metrics`); then each mode's
# speed-up over the reference (the reference's wall time over the mode's).
#
#   usage: bench-wave.sh MODEL TASKS INDEX [OUT]
#   MODEL  a model directory `trainer serve` loads (its tokenizer is the rollout's)
#   TASKS  a task file (JSONL); INDEX the world's local index; OUT logs (runs/bench-wave)
#   WAVE_LIMIT the first N tasks (default 16); WAVE_N attempts per task (default 4);
#   WAVE_INFLIGHT concurrent attempts (default 32, ablation-mini's pipeline.max_inflight);
#   WAVE_MODES (default "masked auto"); WAVE_ROUNDS repeats of the modes (default 1);
#   WAVE_THREADS the server's torch threads (default 1, as ablation-mini's servers);
#   WAVE_EXPERIMENT the preset (default ablation-mini); WAVE_PORT (default 8960);
#   BIN the binaries (default target/release)
set -euo pipefail
if (($# < 3)); then
  sed -n '2,19p' "$0" >&2  # the usage above
  exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="$1" TASKS="$2" INDEX="$3" OUT="${4:-runs/bench-wave}"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/rubricem}"
LIMIT="${WAVE_LIMIT:-16}" N="${WAVE_N:-4}" INFLIGHT="${WAVE_INFLIGHT:-32}"
ROUNDS="${WAVE_ROUNDS:-1}" THREADS="${WAVE_THREADS:-1}" PORT="${WAVE_PORT:-8960}"
EXPERIMENT="${WAVE_EXPERIMENT:-ablation-mini}"
BIN="${BIN:-$ROOT/target/release}"
say() { echo "bench-wave: $*" >&2; }
[[ -f "$MODEL/model.safetensors" ]] || { say "no model at $MODEL"; exit 2; }
[[ -f "$TASKS" ]] || { say "no task file at $TASKS"; exit 2; }
for v in "$LIMIT" "$N" "$INFLIGHT" "$ROUNDS" "$THREADS"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { say "$v is not a positive integer"; exit 2; }
done
MODES="${WAVE_MODES:-masked auto}"
for mode in $MODES; do
  case "$mode" in
    masked | auto | rows) ;;
    *) say "WAVE_MODES holds $mode; allowed: masked, auto, rows"; exit 2 ;;
  esac
done
source "$ROOT/scripts/torch-env.sh"
source "$ROOT/scripts/servers.sh"
port_free "$PORT"
mkdir -p "$OUT"
"$BIN/orchestrator" migrate >/dev/null

PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
metric() { # name: its value in the server's /metrics (nan when it is missing)
  curl -sf "http://127.0.0.1:$PORT/metrics" |
    awk -v m="$1" '$1 == m {print $2; found = 1} END {if (!found) print "nan"}'
}
ROWS=()
for round in $(seq 1 "$ROUNDS"); do
  for mode in $MODES; do
    start_server "$PORT" "$OUT/$mode-$round.server.log" --model "$MODEL" --threads "$THREADS" \
      --device cpu --decode-attention "$mode"
    say "round $round, $mode: $LIMIT tasks x $N"
    t0=$(date +%s.%N)
    "$BIN/orchestrator" rollout --experiment "$EXPERIMENT" --policy-url "http://127.0.0.1:$PORT" \
      --tasks "$TASKS" --limit "$LIMIT" --n "$N" --tokenizer "$MODEL" --index "$INDEX" \
      --max-inflight "$INFLIGHT" >"$OUT/$mode-$round.txt" 2>"$OUT/$mode-$round.log"
    wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')
    gen=$(metric vllm:generation_tokens_total)
    pre=$(metric trainer_prefill_seconds_total)
    dec=$(metric trainer_decode_seconds_total)
    own=$(metric trainer_decode_positions_total)
    span=$(metric trainer_decode_span_positions_total)
    kill "$SERVER_PID"
    wait "$SERVER_PID" 2>/dev/null || true
    ROWS+=("$mode $round $wall $gen $pre $dec $own $span")
  done
done

echo "| mode | round | wall s | tokens | tokens/s | prefill s | decode s | own / span positions | speed-up over masked |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
ref="" last=""
for r in "${ROWS[@]}"; do
  read -r mode round wall gen pre dec own span <<<"$r"
  [[ "$round" != "$last" ]] && ref=""
  last="$round"
  [[ "$mode" == masked ]] && ref="$wall"
  awk -v m="$mode" -v r="$round" -v w="$wall" -v g="$gen" -v p="$pre" -v d="$dec" -v o="$own" \
    -v s="$span" -v ref="$ref" 'BEGIN {
      printf "| %s | %s | %.1f | %d | %.0f | %.1f | %.1f | %.2f | %s |\n", m, r, w, g, g / w, p, d,
        (s > 0 ? o / s : 0), (ref == "" ? "-" : sprintf("%.2fx", ref / w))
    }'
done
