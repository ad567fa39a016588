#!/usr/bin/env bash
# The smoke run's inputs, created once (each step is skipped when its output exists):
#   research world + local index -> offline teacher SFT data -> tokenizer + small Qwen3 model
#   -> [copying exercise, `trainer sft --copy-rows`, DIR/model-copy] -> `trainer sft` warm start,
#   (two passes) in DIR/model-sft: what `trainer serve` loads and the smoke preset's
#   data.tokenizer names.
# Used by scripts/smoke.sh on a host and by compose.yaml's one-shot `init` service, so
# `docker compose up` on a fresh clone finds what the trainer and orchestrator expect.
#
#   usage: init-smoke.sh [DIR]        (default runs/smoke, relative to the working directory)
#   ORCH_BIN     the orchestrator binary (default: `orchestrator` on PATH)
#   TRAINER_BIN  the trainer binary (default: `trainer` on PATH)
#   SMOKE_SFT_EPOCHS  epochs of the first SFT pass (default 1: 384 steps of 8 rows, demonstrations
#                and copy rows, cosine from 2e-3)
#   INIT_SFT_PASSES   2 (default): a second SFT pass, one epoch cosine from 1e-3, other row
#                order (the first writes DIR/model-sft1); 1: the first pass writes DIR/model-sft
#   INIT_DOCS, INIT_TASKS, INIT_HELD_OUT, INIT_VOCAB, SMALL_CONFIG  world size (4000 documents,
#                1536 training tasks, 16 held-out tasks about other lineages: the smoke preset's),
#                tokenizer vocabulary (2048; 4096 until session 27, BENCHMARKS.md) and model
#                config (trainer/configs/small.json);
#                tests shrink them, the smoke run keeps the defaults
#   INIT_SFT_SPLIT  MOD:REM (e.g. 3:2; default empty: every training task): the training tasks are
#                split by lineage (scripts/split-tasks-by-lineage.py): lineages L with L % MOD == REM
#                go to world/tasks-rl.jsonl, the rest to world/tasks-sft.jsonl; the SFT data comes
#                from the latter only (sft-demos.jsonl) and is repeated in order to as many rows as
#                there are training tasks (sft.jsonl), so the warm start takes the default's steps
#                and copy-row mix on fewer distinct demonstrations. RL on tasks-rl.jsonl then
#                trains on lineages the warm start never saw a demonstration of (issue 25).
#   INIT_TOKENIZER_NAMES  corpus (default), keep or drop: where the tokenizer sees the world's
#                entity names (scripts/tokenizer-corpus.py; corpus: only in the documents, so
#                held-out names are spelled with the same pieces as training names)
#   INIT_SPLIT_DIGITS  1: the tokenizer writes every digit as a token of its own (`trainer
#                tokenizer train --split-digits`); default 0: BPE merges digits, and ids the SFT
#                data repeats become single tokens (BENCHMARKS.md, issue 25 session 66)
#   INIT_INPUTS_ONLY  1: stop once the tokenizer and model-init exist, before the training
#                stages (to train them elsewhere: scripts/device-check.sh pack-warm and warm)
#   INIT_DEVICE, INIT_DTYPE  where the three `trainer sft` stages train (default cpu) and the
#                parameter dtype (default auto: f32 on CPU, bf16 on CUDA); cuda with f32 trains on a
#                GPU what the CPU would, in minutes (scripts/device-check.sh pack-warm, then warm)
#   INIT_COPY_ROWS  copy sequences trained on before the SFT, 16 a step (default 96,000: 6,000
#                steps, about 28 minutes; content copying forms after a plateau, at step ~5,560
#                in BENCHMARKS.md's issue 25 session 16 run, and 48,000 stopped on the plateau;
#                0 skips the exercise)
#   INIT_COPY_LR  the exercise's constant rate after 20 warm-up steps (default 1e-3; at 3e-3
#                copying formed ~2,000 steps sooner, but the weights grew ~5x and the SFT from
#                that model looped on every held-out task: BENCHMARKS.md, session 33)
#   INIT_WARM_START  a saved warm start (a model directory holding the provenance.txt of the
#                init-smoke run that trained it; warm-starts/split-3-2 is one, with
#                INIT_SFT_SPLIT=3:2) copied to DIR/model-sft instead of training one: the world,
#                the SFT data and the tokenizer are generated as always and must hash as that
#                provenance records, or the script stops naming the file that differs. This
#                machine takes 60-160 minutes to train the warm start (BENCHMARKS.md, issue 25),
#                and the same inputs give another model on another CPU (session 23).
# A warm start stopped part way (a session out of time) resumes at the first model stage whose
# directory is missing: model-copy, model-sft1 and model-sft are each written whole or not at all,
# and within that stage from its last checkpoint (`trainer sft --save-every`, in
# DIR/model-*.resume; every 500 copy steps, every 64 SFT steps), exactly as if never stopped.
# Needs python3 (standard library only) to assemble the tokenizer corpus. No database.
# Writes DIR/provenance.txt: the CPU model, the commit and the SHA-256 of every stage's output.
set -euo pipefail
DIR="${1:-runs/smoke}"
ORCH="${ORCH_BIN:-orchestrator}"
TRAINER="${TRAINER_BIN:-trainer}"
say() { echo "init-smoke: $*" >&2; }
TASKS="${INIT_TASKS:-1536}"
COPY_ROWS="${INIT_COPY_ROWS:-96000}"
COPY_LR="${INIT_COPY_LR:-1e-3}"
TOK_NAMES="${INIT_TOKENIZER_NAMES:-corpus}"
DEVICE="${INIT_DEVICE:-cpu}"
DTYPE="${INIT_DTYPE:-auto}"
PASSES="${INIT_SFT_PASSES:-2}"
SPLIT="${INIT_SFT_SPLIT:-}"
WARM="${INIT_WARM_START:-}"
if [[ -n "$SPLIT" && ! "$SPLIT" =~ ^[0-9]+:[0-9]+$ ]]; then
  say "INIT_SFT_SPLIT = $SPLIT; expected MOD:REM, e.g. 3:2"
  exit 2
fi
if [[ "$PASSES" != 1 && "$PASSES" != 2 ]]; then
  say "INIT_SFT_PASSES = $PASSES; allowed: 1, 2"
  exit 2
fi
for b in "$ORCH" "$TRAINER" python3; do
  command -v "$b" >/dev/null 2>&1 || { say "$b not found (set ORCH_BIN / TRAINER_BIN)"; exit 2; }
done

mkdir -p "$DIR"
# The commit this run starts from, for DIR/provenance.txt (written at the end).
GIT_AT_START="$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ ! -f "$DIR/world/tasks.jsonl" ]]; then
  "$ORCH" world generate --seed 17 --docs "${INIT_DOCS:-4000}" --tasks "$TASKS" \
    --held-out "${INIT_HELD_OUT:-16}" --out "$DIR/world"
fi
if [[ ! -f "$DIR/index/meta.json" ]]; then
  "$ORCH" index build --corpus "$DIR/world/corpus.jsonl" --out "$DIR/index"
fi
# Every stage skips when its output exists, so a DIR built one way must not be resumed the other
# way: its sft.jsonl would silently keep the other side's data.
if [[ -f "$DIR/sft.jsonl" && -n "$SPLIT" && ! -f "$DIR/sft-demos.jsonl" ]]; then
  say "INIT_SFT_SPLIT = $SPLIT, but $DIR/sft.jsonl was built from every training task (no"
  say "sft-demos.jsonl beside it); use a new DIR, or unset INIT_SFT_SPLIT to resume this one"
  exit 2
fi
if [[ -f "$DIR/sft-demos.jsonl" && -z "$SPLIT" ]]; then
  say "$DIR was built with INIT_SFT_SPLIT (sft-demos.jsonl is there); set it again to resume"
  say "this DIR, or use a new DIR for a warm start from every training task"
  exit 2
fi
SFT_TASKS="$DIR/world/tasks.jsonl"
if [[ -n "$SPLIT" ]]; then
  SFT_TASKS="$DIR/world/tasks-sft.jsonl"
  if [[ ! -f "$DIR/world/tasks-rl.jsonl" || ! -f "$SFT_TASKS" ]]; then
    python3 "$(dirname "${BASH_SOURCE[0]}")/split-tasks-by-lineage.py" "$DIR/world/tasks.jsonl" \
      "$SFT_TASKS" "$DIR/world/tasks-rl.jsonl" --mod "${SPLIT%%:*}" --rem "${SPLIT##*:}"
  fi
  if [[ ! -s "$SFT_TASKS" || ! -s "$DIR/world/tasks-rl.jsonl" ]]; then
    say "INIT_SFT_SPLIT = $SPLIT left one side of the training tasks empty (see above)"
    exit 2
  fi
fi
if [[ ! -f "$DIR/sft.jsonl" ]]; then
  say "SFT data from the offline teacher"
  DEMOS_OUT="$DIR/sft.jsonl"
  if [[ -n "$SPLIT" ]]; then DEMOS_OUT="$DIR/sft-demos.jsonl"; fi
  "$ORCH" sft-data --experiment smoke --set "data.tasks=$SFT_TASKS" \
    --set "data.index=$DIR/index" --out "$DEMOS_OUT"
  if [[ -n "$SPLIT" ]]; then
    DEMOS=$(wc -l <"$DIR/sft-demos.jsonl")
    if [[ "$DEMOS" == 0 ]]; then
      say "the offline teacher wrote no demonstration for $SFT_TASKS"
      exit 1
    fi
    # In order, as many whole copies as reach the training tasks' count, then cut to it.
    rm -f "$DIR/sft.jsonl.part"
    for _ in $(seq 1 $(((TASKS + DEMOS - 1) / DEMOS))); do
      cat "$DIR/sft-demos.jsonl" >>"$DIR/sft.jsonl.part"
    done
    head -n "$TASKS" "$DIR/sft.jsonl.part" >"$DIR/sft.jsonl"
    rm -f "$DIR/sft.jsonl.part"
    say "$DEMOS demonstrations of $(wc -l <"$SFT_TASKS") tasks, repeated to $TASKS rows"
  fi
fi
tokenizer() { # the tokenizer from this DIR's corpus (the documents, then the SFT text)
  python3 "$(dirname "${BASH_SOURCE[0]}")/tokenizer-corpus.py" "$DIR" --names "$TOK_NAMES"
  "$TRAINER" tokenizer train --corpus "$DIR/tokenizer-corpus.txt" \
    --vocab "${INIT_VOCAB:-2048}" --out "$DIR/tokenizer" \
    $([[ "${INIT_SPLIT_DIGITS:-0}" == 1 ]] && echo --split-digits)
}
if [[ -n "$WARM" && ! -f "$DIR/model-sft/model.safetensors" ]]; then
  for f in config.json model.safetensors tokenizer.json tokenizer_config.json provenance.txt; do
    if [[ ! -f "$WARM/$f" ]]; then
      say "INIT_WARM_START = $WARM has no $f (a model directory with its provenance.txt)"
      exit 2
    fi
  done
  tokenizer
  # The inputs the saved model was trained from, as its provenance recorded them, against the
  # ones this DIR has just generated.
  INPUTS="$(grep -E '^[0-9a-f]{64}  (world/tasks(-sft|-rl)?\.jsonl|sft-demos\.jsonl|sft\.jsonl|tokenizer/tokenizer\.json)$' \
    "$WARM/provenance.txt" || true)"
  if ! grep -q '  sft\.jsonl$' <<<"$INPUTS" || ! grep -q '  tokenizer/tokenizer\.json$' <<<"$INPUTS"; then
    say "INIT_WARM_START = $WARM: its provenance.txt records no hash of sft.jsonl or"
    say "tokenizer/tokenizer.json, so what it was trained from cannot be checked"
    exit 2
  fi
  if ! DIFF="$(cd "$DIR" && sha256sum --check --quiet <<<"$INPUTS" 2>&1)"; then
    say "INIT_WARM_START = $WARM was trained from other inputs than $DIR now holds:"
    say "$DIFF"
    say "(the world generator, the split, the teacher or the tokenizer recipe changed since it"
    say "was saved: train the warm start again without INIT_WARM_START)"
    exit 2
  fi
  if ! cmp -s "$WARM/tokenizer.json" "$DIR/tokenizer/tokenizer.json"; then
    say "INIT_WARM_START = $WARM: its tokenizer.json is not the tokenizer its provenance records"
    exit 2
  fi
  rm -rf "$DIR/model-sft.part"
  mkdir -p "$DIR/model-sft.part"
  cp "$WARM"/*.json "$WARM/model.safetensors" "$DIR/model-sft.part/"
  cp "$WARM/provenance.txt" "$DIR/model-sft.part/warm-start-provenance.txt"
  mv "$DIR/model-sft.part" "$DIR/model-sft"
  say "warm start taken from $WARM: its $(wc -l <<<"$INPUTS") recorded inputs match this DIR's"
fi
if [[ ! -f "$DIR/model-sft/model.safetensors" ]]; then
  say "tokenizer + small model + SFT warm start"
  # Each model stage below is skipped when its directory holds a model: the trainer writes a
  # model directory atomically, so one that exists is whole, and a warm start stopped during
  # the SFT resumes there instead of repeating the copying exercise. The tokenizer and the
  # random init take seconds and are redone together unless model-init is complete (its
  # generation_config.json is written last).
  if [[ ! -f "$DIR/model-init/generation_config.json" ]]; then
    tokenizer
    CONFIG="${SMALL_CONFIG:-$(dirname "${BASH_SOURCE[0]}")/../trainer/configs/small.json}"
    "$TRAINER" init --config "$CONFIG" --tokenizer "$DIR/tokenizer" --out "$DIR/model-init"
  fi
  if [[ "${INIT_INPUTS_ONLY:-0}" == 1 ]]; then
    say "inputs ready (INIT_INPUTS_ONLY=1): the training stages start from $DIR/model-init"
    exit 0
  fi
  START="$DIR/model-init"
  MIX=()
  if [[ "$COPY_ROWS" != 0 ]]; then
    # A model from random weights cannot copy a name it has seen once in its context (issue
    # 25: no warm start so far named the question's entity in its search); a random span
    # repeated at a random distance is the exercise for it (BENCHMARKS.md, session 15).
    if [[ ! -f "$DIR/model-copy/model.safetensors" ]]; then
      say "copying exercise"
      "$TRAINER" sft --copy-rows "$COPY_ROWS" --copy-length 32 --model "$START" \
        --out "$DIR/model-copy" --epochs 1 --batch 16 --lr "$COPY_LR" --warmup-steps 20 \
        --save-every 500 --device "$DEVICE" --dtype "$DTYPE"
    fi
    START="$DIR/model-copy"
    # One copy row per demonstration keeps the circuit through the SFT (random-distance top-1
    # 0.724 before, 0.696 after).
    MIX=(--copy-rows "$TASKS" --copy-length 32)
  fi
  OUT="$DIR/model-sft"
  if [[ "$PASSES" == 2 ]]; then OUT="$DIR/model-sft1"; fi
  if [[ ! -f "$OUT/model.safetensors" ]]; then
    "$TRAINER" sft --data "$DIR/sft.jsonl" ${MIX[@]+"${MIX[@]}"} --model "$START" \
      --out "$OUT" --epochs "${SMOKE_SFT_EPOCHS:-1}" --batch 8 --lr 2e-3 \
      --schedule cosine --warmup-steps 10 --save-every 64 --device "$DEVICE" --dtype "$DTYPE"
  fi
  if [[ "$PASSES" == 2 ]]; then
    # A second pass at half the rate, other row order: greedy on the held-out tasks the model
    # then answers 7 of 16 (4 after one pass) and scores 0.125 (0.000): fewer trajectories run
    # to the token budget in a loop (BENCHMARKS.md, issue 25 session 16, on that session's
    # longer demonstrations; not yet measured apart on session 17's shorter ones).
    say "second SFT pass"
    "$TRAINER" sft --data "$DIR/sft.jsonl" ${MIX[@]+"${MIX[@]}"} --model "$OUT" \
      --out "$DIR/model-sft" --epochs 1 --batch 8 --lr 1e-3 --schedule cosine \
      --warmup-steps 10 --seed 1 --save-every 64 --device "$DEVICE" --dtype "$DTYPE"
  fi
fi
# Provenance: what each stage wrote, with the machine that ran it, so two warm starts can be
# compared stage by stage (the first file whose hash differs is where they part). Floating
# point in the trainer's steps depends on the CPU's kernels (AVX2 / AVX-512 paths in oneDNN),
# so identical inputs on another CPU model can still part at the first training stage.
{
  echo "# init-smoke provenance, $(date -u +%FT%TZ)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')"
  echo "git at start: $GIT_AT_START"
  echo "trainer sft stages: --device $DEVICE --dtype $DTYPE (unless model-sft was saved before)"
  if [[ -f "$DIR/model-sft/warm-start-provenance.txt" ]]; then
    echo "model-sft: a saved warm start, trained as model-sft/warm-start-provenance.txt records"
  fi
  for f in world/tasks.jsonl world/corpus.jsonl world/tasks-sft.jsonl world/tasks-rl.jsonl \
    sft-demos.jsonl sft.jsonl tokenizer/tokenizer.json \
    model-init/model.safetensors model-copy/model.safetensors model-sft1/model.safetensors \
    model-sft/model.safetensors; do
    if [[ -f "$DIR/$f" ]]; then (cd "$DIR" && sha256sum "$f"); fi
  done
} >"$DIR/provenance.txt"
say "ready: $DIR/model-sft (hashes in $DIR/provenance.txt)"
