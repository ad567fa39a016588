#!/usr/bin/env bash
# The ablation-mini experiment on this machine (README, "Recipes over seeds"): two orchestrators
# share one experiment, each with its own pair of one-thread servers (a policy server on PORT+1
# and a trainer on PORT that publishes every version to it), so both cores stay busy; each
# orchestrator takes the runs the other does not hold. Ends with `orchestrator report`.
#
#   usage: scripts/ablation-mini.sh
#   ABLATION_RESUME  an experiment id: continue it (both orchestrators resume it)
#   ABLATION_PAIRS   1 or 2 (default 2) server pairs and orchestrators
#   ABLATION_PORT    the first pair's trainer port (default 8100; its policy server takes
#                    PORT+1, the second pair PORT+100 and PORT+101), so two experiments can run
#                    side by side on other ports
#   ABLATION_ARGS    extra `orchestrator run` arguments for a new experiment (e.g. --set ...)
#   ABLATION_EXPERIMENT  the preset (default ablation-mini; scripts/guided.sh runs `guided`)
#   ABLATION_DIR     where logs, checkpoints and published versions go (runs/ablation-mini)
#   BIN              directory of the release binaries (default target/release; built if absent)
#   ABLATION_MODEL   the warm start every run begins from (default runs/smoke/model-sft); its
#                    tokenizer must be the one data.tokenizer names (pass --set in ABLATION_ARGS)
# Needs the smoke warm start (runs/smoke/model-sft: scripts/init-smoke.sh, or
# SMOKE_PREP_ONLY=1 scripts/smoke.sh) and Postgres at DATABASE_URL.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/rubricem}"
OUT="${ABLATION_DIR:-runs/ablation-mini}"
PAIRS="${ABLATION_PAIRS:-2}"
PORT="${ABLATION_PORT:-8100}"
MODEL="${ABLATION_MODEL:-runs/smoke/model-sft}"
EXPERIMENT="${ABLATION_EXPERIMENT:-ablation-mini}"
say() { echo "ablation-mini: $*" >&2; }
if [[ "$PAIRS" != 1 && "$PAIRS" != 2 ]]; then
  say "ABLATION_PAIRS = $PAIRS; allowed: 1, 2"
  exit 2
fi
if [[ ! "$PORT" =~ ^[0-9]+$ ]] || ((PORT < 1024 || PORT > 65434)); then
  say "ABLATION_PORT = $PORT; allowed: 1024 to 65434 (the pairs use PORT to PORT+101)"
  exit 2
fi
if [[ ! -f "$MODEL/model.safetensors" ]]; then
  say "no warm start at $MODEL: run scripts/init-smoke.sh first"
  exit 2
fi
source scripts/torch-env.sh
BIN="${BIN:-target/release}"
if [[ ! -x "$BIN/orchestrator" || ! -x "$BIN/trainer" ]]; then
  cargo build --release -p orchestrator -p trainer
fi
"$BIN/orchestrator" migrate >/dev/null
mkdir -p "$OUT"

PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
source scripts/servers.sh
# One orchestrator on the pair at PORT; its output in $OUT/NAME/run.log (an earlier attempt's,
# e.g. before a resume, kept as run.log.1, ...).
orchestrate() { # port name [run args...]
  local port=$1 name=$2
  shift 2
  keep_log "$OUT/$name/run.log"
  "$BIN/orchestrator" run --experiment "$EXPERIMENT" --policy-url "http://127.0.0.1:$((port + 1))" \
    --trainer-url "http://127.0.0.1:$port" "$@" >"$OUT/$name/run.log" 2>&1 &
  PIDS+=($!)
  ORCH_PIDS+=($!)
}

ORCH_PIDS=()
start_split_pair "$PORT" "$MODEL" "$OUT/a"
if [[ -n "${ABLATION_RESUME:-}" ]]; then
  EXP="$ABLATION_RESUME"
  orchestrate "$PORT" a --resume "$EXP"
else
  # shellcheck disable=SC2086
  orchestrate "$PORT" a ${ABLATION_ARGS:-}
  EXP=""
  for _ in $(seq 1 600); do
    EXP=$(grep -ao 'registered as [0-9a-f-]*' "$OUT/a/run.log" 2>/dev/null | awk '{print $3}' | tail -1 || true)
    [[ -n "$EXP" ]] && break
    if ! kill -0 "${ORCH_PIDS[0]}" 2>/dev/null; then
      say "the first orchestrator stopped before registering the experiment; see $OUT/a/run.log"
      exit 1
    fi
    sleep 1
  done
  [[ -n "$EXP" ]] || { say "no experiment id in $OUT/a/run.log"; exit 1; }
fi
say "experiment $EXP (logs under $OUT)"
if [[ "$PAIRS" == 2 ]]; then
  start_split_pair $((PORT + 100)) "$MODEL" "$OUT/b"
  orchestrate $((PORT + 100)) b --resume "$EXP"
fi
status=0
for p in "${ORCH_PIDS[@]}"; do
  wait "$p" || status=$?
done
"$BIN/orchestrator" report "$EXP" --out "$OUT/reports" || status=$?
say "experiment $EXP: report in $OUT/reports (exit $status)"
exit "$status"
