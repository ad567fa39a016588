#!/usr/bin/env bash
# A reflection pass on a smoke warm start (issue 25): without one, the warm start writes no valid
# reflection (0 of 1,152 candidates in BENCHMARKS.md's issue 25 session 36), so every reflection
# group is degenerate, the meta-policy never trains and the rubric bank stays empty. The offline
# teacher writes one reflection demonstration per demonstration of the SFT tasks
# (`orchestrator sft-data --reflections-out`: the meta-policy's own prompt over the attempt, a
# quarter of the attempts cut after an earlier search and answered, a quarter degenerating into
# a loop until the token budget as a small policy's do, and a post-mortem of what the attempt
# shows, never of gold rubrics or the known answer); REFLECT_ROWS of them, interleaved with as many agent
# demonstrations with the rubric bank's `<reference_examples>` block in front of the question
# (`--injected-out`: a meta-policy run injects that block into every question once the bank
# has items, and a warm start that never saw it fell to reward 0 under it) and as many plain
# ones, make one more SFT pass from DIR/model-sft into DIR/model-reflect. Each step is skipped
# when its output exists.
#
#   usage: reflection-pass.sh DIR      (DIR made by scripts/init-smoke.sh)
#   REFLECT_ROWS  reflection demonstrations used (default 512; as many injected and as many
#                 plain agent rows beside them)
#   REFLECT_LR    peak learning rate (default 5e-4; cosine to a tenth, 10 warm-up steps)
#   REFLECT_FROM, REFLECT_OUT  the model the pass starts from and the one it writes, under DIR
#                 (default model-sft and model-reflect; e.g. model-reflect and model-reflect2
#                 for a second pass)
#   REFLECT_SEED  the trainer's row-order seed (default 2)
#   REFLECT_SKIP  demonstrations skipped at the head of each file before the REFLECT_ROWS taken
#                 (default 0; e.g. 512 for a further pass over tasks the earlier passes, which
#                 all took the first 512, never trained on)
#   REFLECT_INJECTED_SKIP  the same for the injected rows alone (default REFLECT_SKIP; e.g. 512
#                 with REFLECT_SKIP=0: the reflection and plain rows the earlier passes took,
#                 beside injected rows of tasks those passes never showed with a block)
#   REFLECT_EXPERIMENT  the preset whose reflection.top_k, reflection.max_item_chars and
#                 embedder shape the injected blocks (default smoke; ablation-mini for the
#                 warm start its runs start from: one item, as they inject it)
#   REFLECT_DEVICE, REFLECT_DTYPE  where the pass trains and the parameter dtype (default cpu
#                 and auto: f32 on CPU; cuda with f32 trains on a GPU what the CPU would:
#                 scripts/device-check.sh pack-reflect here, then reflect there)
#   REFLECT_DATA_ONLY  1: stop once DIR/sft-reflect.jsonl exists, before the SFT pass
#   ORCH_BIN, TRAINER_BIN  the binaries (default: on PATH)
# Writes DIR/sft-reflect-demos.jsonl (every reflection demonstration),
# DIR/sft-reflect-injected.jsonl (every agent demonstration with a block), DIR/sft-reflect.jsonl
# (the pass's rows), DIR/model-reflect and DIR/provenance-model-reflect.txt (the SHA-256 of
# each).
set -euo pipefail
DIR="${1:?usage: reflection-pass.sh DIR}"
ORCH="${ORCH_BIN:-orchestrator}"
TRAINER="${TRAINER_BIN:-trainer}"
ROWS="${REFLECT_ROWS:-512}"
LR="${REFLECT_LR:-5e-4}"
FROM="${REFLECT_FROM:-model-sft}"
OUT="${REFLECT_OUT:-model-reflect}"
SEED="${REFLECT_SEED:-2}"
EXPERIMENT="${REFLECT_EXPERIMENT:-smoke}"
SKIP="${REFLECT_SKIP:-0}"
INJECTED_SKIP="${REFLECT_INJECTED_SKIP:-$SKIP}"
DEVICE="${REFLECT_DEVICE:-cpu}"
DTYPE="${REFLECT_DTYPE:-auto}"
say() { echo "reflection-pass: $*" >&2; }
if [[ ! "$ROWS" =~ ^[0-9]+$ ]] || ((ROWS < 8)); then
  say "REFLECT_ROWS = $ROWS; expected a whole number of at least 8 (one batch)"
  exit 2
fi
if [[ ! "$SKIP" =~ ^[0-9]+$ ]]; then
  say "REFLECT_SKIP = $SKIP; expected a whole number"
  exit 2
fi
if [[ ! "$INJECTED_SKIP" =~ ^[0-9]+$ ]]; then
  say "REFLECT_INJECTED_SKIP = $INJECTED_SKIP; expected a whole number"
  exit 2
fi
if [[ ! -f "$DIR/$FROM/model.safetensors" || ! -f "$DIR/index/meta.json" ]]; then
  say "$DIR has no $FROM or no index: run scripts/init-smoke.sh $DIR first"
  exit 2
fi
SFT_TASKS="$DIR/world/tasks.jsonl"
if [[ -f "$DIR/world/tasks-sft.jsonl" ]]; then SFT_TASKS="$DIR/world/tasks-sft.jsonl"; fi
if [[ ! -f "$DIR/sft-reflect.jsonl" ]]; then
  "$ORCH" sft-data --experiment "$EXPERIMENT" --set "data.tasks=$SFT_TASKS" \
    --set "data.index=$DIR/index" --out "$DIR/sft-reflect-agent.jsonl" \
    --reflections-out "$DIR/sft-reflect-demos.jsonl" \
    --injected-out "$DIR/sft-reflect-injected.jsonl"
  for f in "sft-reflect-demos $SKIP REFLECT_SKIP" "sft-reflect-injected $INJECTED_SKIP REFLECT_INJECTED_SKIP"; do
    read -r file skip name <<<"$f"
    HAVE=$(wc -l <"$DIR/$file.jsonl")
    if ((HAVE < skip + ROWS)); then
      say "$name + REFLECT_ROWS = $((skip + ROWS)), but the teacher wrote $HAVE rows to $DIR/$file.jsonl"
      exit 2
    fi
  done
  # A reflection row, an agent row with the bank's block injected, a plain agent row, in the
  # teacher's order (the trainer shuffles).
  take() { tail -n "+$(($2 + 1))" "$1" | head -n "$ROWS"; }
  paste -d '\n' <(take "$DIR/sft-reflect-demos.jsonl" "$SKIP") \
    <(take "$DIR/sft-reflect-injected.jsonl" "$INJECTED_SKIP") \
    <(take "$DIR/sft-reflect-agent.jsonl" "$SKIP") >"$DIR/sft-reflect.jsonl.part"
  mv "$DIR/sft-reflect.jsonl.part" "$DIR/sft-reflect.jsonl"
  rm -f "$DIR/sft-reflect-agent.jsonl"
fi
if [[ "${REFLECT_DATA_ONLY:-0}" == 1 ]]; then
  say "rows ready (REFLECT_DATA_ONLY=1): $DIR/sft-reflect.jsonl"
  exit 0
fi
if [[ ! -f "$DIR/$OUT/model.safetensors" ]]; then
  say "SFT pass on $(wc -l <"$DIR/sft-reflect.jsonl") rows from $DIR/$FROM"
  "$TRAINER" sft --data "$DIR/sft-reflect.jsonl" --model "$DIR/$FROM" \
    --out "$DIR/$OUT" --epochs 1 --batch 8 --lr "$LR" --schedule cosine \
    --warmup-steps 10 --seed "$SEED" --save-every 64 --device "$DEVICE" --dtype "$DTYPE"
fi
{
  echo "# reflection-pass provenance, $(date -u +%FT%TZ), REFLECT_ROWS=$ROWS REFLECT_LR=$LR REFLECT_SEED=$SEED REFLECT_SKIP=$SKIP REFLECT_INJECTED_SKIP=$INJECTED_SKIP REFLECT_EXPERIMENT=$EXPERIMENT REFLECT_DEVICE=$DEVICE REFLECT_DTYPE=$DTYPE"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')"
  echo "git: $(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  (cd "$DIR" && sha256sum "$FROM/model.safetensors" sft-reflect-demos.jsonl \
    sft-reflect-injected.jsonl sft-reflect.jsonl "$OUT/model.safetensors")
} >"$DIR/provenance-$OUT.txt"
say "ready: $DIR/$OUT (hashes in $DIR/provenance-$OUT.txt)"
