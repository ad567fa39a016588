#!/usr/bin/env bash
# The `guided` experiment end to end (orchestrator/experiments/guided.toml: the research world's
# learning run, BENCHMARKS.md issue 25): every input under runs/guided, then the seeds one after
# another on one server pair (scripts/ablation-mini.sh), then `orchestrator report`.
#   1. the smoke world split by lineage and the saved warm start warm-starts/split-3-2-reflect
#      (scripts/init-smoke.sh with INIT_SFT_SPLIT=3:2 INIT_WARM_START=...: seconds, and it stops
#      naming the file if this checkout generates other inputs than the warm start recorded);
#   2. the RL tasks (one sixth of the lineages the warm start never saw: 260 tasks over 111
#      lineages) and the unseen evaluation set (106 tasks over 66 other lineages sharing no
#      entity or answer with any training task);
#   3. the offline teacher's demonstration of every RL task (`orchestrator sft-data`; it follows
#      the world's evidence chain and never sees a gold rubric): credit.guidance_demos.
#   4. after `orchestrator report`, each seed's last four checkpoints (v72-v84) averaged, the
#      policy the preset delivers, and evaluated on the same sets (scripts/eval-average.sh).
# Each step is skipped when its output exists. Preparing took under a minute; the preset's 84
# steps took 11.4-11.8 minutes of RL (18 on the wall clock with the evaluations) for one seed
# alone on a 2-core Zen 4 in bf16 (GUIDED_PAIRS=1; BENCHMARKS.md, issue 25 session 89), 7.2-8.3
# (about 10.5 and 2.5 more for the average's evaluation) on a 2-core Zen 5 (session 90).
#
#   usage: scripts/guided.sh
#   GUIDED_DIR        where everything goes (default runs/guided; the preset's paths name
#                     runs/guided, so another DIR needs --set data.* / credit.* / eval.sets in
#                     GUIDED_ARGS)
#   GUIDED_WARM_START the saved warm start (default warm-starts/split-3-2-reflect)
#   GUIDED_ARGS       extra `orchestrator run` arguments (e.g. "--set experiment.seeds=[19]")
#   GUIDED_RESUME     an experiment id to continue (after a crash or Ctrl-C)
#   GUIDED_PAIRS      server pairs, 1 (default: the seeds one after the other, each with the
#                     machine to itself, as the smoke budget was measured) or 2 (one seed on
#                     each, side by side: each seed's RL about 1.5x longer on 2 cores, 57
#                     minutes against 38 in session 76)
#   BIN               directory of the release binaries (default target/release; built if absent)
#   GUIDED_DTYPE      the trainer's and the servers' parameter dtype: auto (default) takes what
#                     `trainer info --cpu-dtype` prints: bf16 with AMX-BF16 or AMD's
#                     AVX512-BF16 (the preset's 84 steps were measured so on a Zen 4, session
#                     89, and a Zen 5, session 90), f32 elsewhere (an Intel CPU with
#                     AVX512-BF16 alone trained slower in bf16, session 82); f32 or bf16 choose.
#                     Sets TRAINER_DTYPE for the servers and trainer.param_dtype before
#                     GUIDED_ARGS
#   TRAINER_KV_CACHE_DTYPE  read by every `trainer serve`: bf16 keeps the policy server's batch
#                     cache in bf16 under f32 weights (a step 1.22x faster on a Xeon with
#                     AVX-512 and no AMX; BENCHMARKS.md, issue 25 session 85); default auto
#   GUIDED_AVERAGE    how many of each seed's last checkpoints to average into its delivered
#                     policy (default 4: v72, v76, v80 and v84, the rule of session 90), which
#                     scripts/eval-average.sh evaluates after the report; 0 skips it
#   DATABASE_URL      default postgres://postgres@127.0.0.1:5432/rubricem (read by
#                     scripts/ablation-mini.sh, which applies the migrations; the steps before
#                     it need no database)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DIR="${GUIDED_DIR:-runs/guided}"
WARM="${GUIDED_WARM_START:-warm-starts/split-3-2-reflect}"
BIN="${BIN:-target/release}"
say() { echo "guided: $*" >&2; }

case "${GUIDED_DTYPE:-auto}" in
  auto | f32 | bf16) ;;
  *)
    say "GUIDED_DTYPE=$GUIDED_DTYPE: expected auto, f32 or bf16"
    exit 2
    ;;
esac
AVG="${GUIDED_AVERAGE:-4}"
if [[ ! "$AVG" =~ ^[0-9]+$ || "$AVG" == 1 ]]; then
  say "GUIDED_AVERAGE = $AVG; allowed: 0 (no average) or 2 and more checkpoints"
  exit 2
fi

# shellcheck source=/dev/null
source scripts/torch-env.sh
if [[ ! -x "$BIN/orchestrator" || ! -x "$BIN/trainer" ]]; then
  cargo build --release -p orchestrator -p trainer
fi
DTYPE="${GUIDED_DTYPE:-auto}"
if [[ "$DTYPE" == auto ]]; then DTYPE=$("$BIN/trainer" info --cpu-dtype); fi
export TRAINER_DTYPE="$DTYPE"
say "parameters in $DTYPE (GUIDED_DTYPE=${GUIDED_DTYPE:-auto})"

INIT_SFT_SPLIT=3:2 INIT_WARM_START="$WARM" ORCH_BIN="$BIN/orchestrator" \
  TRAINER_BIN="$BIN/trainer" bash scripts/init-smoke.sh "$DIR"

W="$DIR/world"
if [[ ! -s "$W/tasks-rl6.jsonl" || ! -s "$W/pool-unseen.jsonl" ]]; then
  python3 scripts/split-tasks-by-lineage.py "$W/tasks-rl.jsonl" "$W/tasks-rl6.jsonl" \
    "$W/pool-unseen.jsonl" --mod 6 --rem 5
fi
if [[ ! -s "$W/unseen-eval.jsonl" ]]; then
  python3 scripts/disjoint-eval-tasks.py "$W/pool-unseen.jsonl" "$W/unseen-eval.jsonl" \
    --train "$W/tasks-sft.jsonl" "$W/tasks-rl6.jsonl"
fi
if [[ ! -s "$DIR/rl-demos.jsonl" ]]; then
  say "the offline teacher's demonstrations of the RL tasks"
  "$BIN/orchestrator" sft-data --experiment guided --set "data.tasks=$W/tasks-rl6.jsonl" \
    --set "data.index=$DIR/index" --set "data.tokenizer=$DIR/model-sft" \
    --out "$DIR/rl-demos.jsonl.part"
  mv "$DIR/rl-demos.jsonl.part" "$DIR/rl-demos.jsonl"
fi
say "RL tasks $(wc -l <"$W/tasks-rl6.jsonl"), unseen evaluation tasks $(wc -l <"$W/unseen-eval.jsonl"), demonstrations $(wc -l <"$DIR/rl-demos.jsonl")"

ABLATION_EXPERIMENT=guided ABLATION_DIR="$DIR/rl" ABLATION_MODEL="$DIR/model-sft" BIN="$BIN" \
  ABLATION_PAIRS="${GUIDED_PAIRS:-1}" ABLATION_RESUME="${GUIDED_RESUME:-}" \
  ABLATION_ARGS="--set trainer.param_dtype=$DTYPE ${GUIDED_ARGS:-}" bash scripts/ablation-mini.sh

# The delivered policy of each seed: the mean of its last GUIDED_AVERAGE checkpoints (v72-v84 of
# the preset's 84 steps), evaluated beside the run's own versions (scripts/eval-average.sh).
((AVG == 0)) && exit 0
EXP="${GUIDED_RESUME:-$(grep -ao 'registered as [0-9a-f-]*' "$DIR/rl/a/run.log" | awk '{print $3}' | tail -1)}"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/rubricem}"
NAME=$(psql "$DATABASE_URL" -Atq -v exp="$EXP" <<<"SELECT name FROM experiments WHERE id::text = :'exp';")
for seed in $(psql "$DATABASE_URL" -Atq -v exp="$EXP" \
  <<<"SELECT DISTINCT seed FROM runs WHERE experiment_id::text = :'exp' ORDER BY seed;"); do
  mapfile -t versions < <(psql "$DATABASE_URL" -Atq -v exp="$EXP" -v seed="$seed" -v n="$AVG" <<'SQL'
SELECT v FROM (
    SELECT DISTINCT c.policy_version AS v FROM checkpoints c JOIN runs r ON r.id = c.run_id
    WHERE r.experiment_id::text = :'exp' AND r.seed = :'seed'::int
    ORDER BY v DESC LIMIT :'n'::int
) last ORDER BY v;
SQL
  )
  if ((${#versions[@]} < AVG)); then
    say "seed $seed has ${#versions[@]} checkpoints, fewer than GUIDED_AVERAGE = $AVG: not averaged"
    continue
  fi
  GUIDED_DIR="$DIR" GUIDED_DTYPE="$DTYPE" BIN="$BIN" bash scripts/eval-average.sh "$EXP" "$seed" \
    "$NAME-avg-${EXP: -8}-s$seed" "${versions[@]}"
done

# Over seeds: the change of each seed's mean, and of its last version, over its run's v0, with
# the spread (sd over seeds) issue 25 reads the smoke target against.
say "change over v0 across the seeds of $EXP: each seed's mean (mean_change) and last version"
psql "$DATABASE_URL" -q -v exp="$EXP" -v prefix="$NAME-avg-${EXP: -8}-s" <<'SQL'
WITH src AS (
    SELECT r.id, r.seed FROM runs r WHERE r.experiment_id::text = :'exp'
), ends AS (
    SELECT s.seed, ev.subset,
           min(ev.policy_version) AS first_v, max(ev.policy_version) AS last_v
    FROM evaluations ev JOIN src s ON s.id = ev.run_id GROUP BY s.seed, ev.subset
), per_seed AS (
    SELECT e.seed, e.subset,
           l.score - f.score AS last_change,
           (SELECT m.score - f.score FROM evaluations m JOIN runs mr ON mr.id = m.run_id
            WHERE mr.experiment_id = (SELECT id FROM experiments
                                      WHERE name = :'prefix' || e.seed ORDER BY created_at DESC LIMIT 1)
              AND m.subset = e.subset AND m.policy_version = 0) AS mean_change
    FROM ends e
    JOIN src s ON s.seed = e.seed
    JOIN evaluations f ON f.run_id = s.id AND f.subset = e.subset AND f.policy_version = e.first_v
    JOIN evaluations l ON l.run_id = s.id AND l.subset = e.subset AND l.policy_version = e.last_v
)
SELECT subset, count(mean_change) AS seeds,
       round(avg(mean_change)::numeric, 3)         AS mean_change,
       round(stddev_samp(mean_change)::numeric, 3) AS mean_change_sd,
       round(avg(last_change)::numeric, 3)         AS last_change,
       round(stddev_samp(last_change)::numeric, 3) AS last_change_sd
FROM per_seed GROUP BY subset ORDER BY subset;
SQL
