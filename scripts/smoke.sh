#!/usr/bin/env bash
# The main job on the embedded defaults (no GPU, no keys, no internet), end to end:
#   scripts/init-smoke.sh (research world + local index -> offline teacher SFT data ->
#   tokenizer + small Qwen3 model -> `trainer sft` warm start) -> `trainer serve` x2 (policy
#   server, trainer) -> `orchestrator run --experiment smoke` (RL) -> `orchestrator report`.
# Everything lands under runs/smoke (kept between runs: delete it to start from scratch).
#
#   DATABASE_URL     default postgres://postgres@127.0.0.1:5432/rubricem
#   SMOKE_PROFILE    cargo profile (release | debug; default release)
#   SMOKE_EXPERIMENT preset to run on the smoke back-ends (default smoke; e.g. ablation-600)
#   SMOKE_ARGS       extra arguments for `orchestrator run` (e.g. "--steps 3")
#   SMOKE_PORT       trainer port (default 8100; the split layout's policy server uses +1)
#   SMOKE_PREP_ONLY  1: stop after the SFT model exists (other scripts reuse it as a small LLM)
#   SMOKE_LAYOUT     split (default): a policy server and a trainer, one core each, the trainer
#                    publishing full weights to the server after every step, as a vLLM server
#                    and a trainer would be deployed; shared: one `trainer serve` is both (a train
#                    step then pauses generation)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/rubricem}"
PROFILE="${SMOKE_PROFILE:-release}"
EXPERIMENT="${SMOKE_EXPERIMENT:-smoke}"
PORT="${SMOKE_PORT:-8100}"
LAYOUT="${SMOKE_LAYOUT:-split}"
DIR=runs/smoke
say() { echo "smoke: $*" >&2; }

[[ -x .venv/bin/python ]] || bash scripts/python-env.sh
# shellcheck source=/dev/null
source scripts/torch-env.sh
if [[ "$PROFILE" == release ]]; then
  cargo build --release -p orchestrator -p trainer
  BIN=target/release
else
  cargo build -p orchestrator -p trainer
  BIN=target/debug
fi
"$BIN/orchestrator" migrate >/dev/null

# World, index, SFT data, tokenizer, small model and SFT warm start (skipped when present):
# the same script compose.yaml's `init` service runs.
ORCH_BIN="$BIN/orchestrator" TRAINER_BIN="$BIN/trainer" bash scripts/init-smoke.sh "$DIR"

if [[ "${SMOKE_PREP_ONLY:-0}" == 1 ]]; then
  say "prepared $DIR/model-sft"
  exit 0
fi

PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
source scripts/servers.sh
TRAINER_URL="http://127.0.0.1:$PORT"
case "$LAYOUT" in
  split)
    POLICY_URL="http://127.0.0.1:$((PORT + 1))"
    say "starting the policy server on $POLICY_URL and the trainer on $TRAINER_URL (one core each)"
    start_split_pair "$PORT" "$DIR/model-sft" "$DIR"
    ;;
  shared)
    POLICY_URL="$TRAINER_URL"
    say "starting trainer serve on $TRAINER_URL (policy server and trainer)"
    keep_log "$DIR/trainer.log"
    start_server "$PORT" "$DIR/trainer.log" --model "$DIR/model-sft" \
      --checkpoint-dir "$DIR/checkpoints" --device cpu
    ;;
  *) say "SMOKE_LAYOUT = $LAYOUT; allowed: split, shared"; exit 2 ;;
esac

# The RL learning rate is the experiment's (`[trainer]`, sent to the trainer at start);
# SMOKE_RL_LR overrides it.
LR_SET=()
if [[ -n "${SMOKE_RL_LR:-}" ]]; then LR_SET=(--set "trainer.lr=$SMOKE_RL_LR"); fi
keep_log "$DIR/run.log"
# shellcheck disable=SC2086
"$BIN/orchestrator" run --experiment "$EXPERIMENT" --policy-url "$POLICY_URL" \
  --trainer-url "$TRAINER_URL" ${LR_SET[@]+"${LR_SET[@]}"} ${SMOKE_ARGS:-} | tee "$DIR/run.log"
EXP=$(grep -o 'registered as [0-9a-f-]*' "$DIR/run.log" | awk '{print $3}' | tail -1)
if [[ -n "$EXP" ]]; then
  "$BIN/orchestrator" report "$EXP" --out "$DIR/reports"
fi
