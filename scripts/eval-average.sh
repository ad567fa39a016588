#!/usr/bin/env bash
# Evaluate the weight average of one `guided` run's last checkpoints (latest-weight averaging,
# LAWA, Kaddour 2022): `trainer average` of the run's checkpoints at the versions given, beside
# the warm start's config and tokenizer, evaluated on the preset's evaluation sets as the start
# (v0) of a one-step run of experiment NAME (the step is trained and its v1 evaluated too; read
# only v0). Every evaluation draws its sampling seeds from the task and sample alone, so the
# mean's v0 pairs task by task with the source run's own versions (BENCHMARKS.md, issue 25
# session 90).
#
# It ends with the change of the mean and of the run's last evaluated version over the run's v0
# on each set. scripts/guided.sh runs it for every seed of its experiment (GUIDED_AVERAGE).
#
#   usage: scripts/eval-average.sh SOURCE_EXPERIMENT SEED NAME VERSION VERSION...
#   SOURCE_EXPERIMENT  the source experiment's name (its newest run of SEED) or id
#   GUIDED_DIR     where scripts/guided.sh put the source run (default runs/guided)
#   BIN            directory of the release binaries (default target/release)
#   GUIDED_DTYPE   the servers' and trainer's dtype: auto (default: what `trainer info
#                  --cpu-dtype` prints, as scripts/guided.sh takes it), f32 or bf16
#   DATABASE_URL   default postgres://postgres@127.0.0.1:5432/rubricem
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
say() { echo "eval-average: $*" >&2; }
if (($# < 5)); then
  say "usage: scripts/eval-average.sh SOURCE_EXPERIMENT SEED NAME VERSION VERSION... (at least two versions)"
  exit 2
fi
SOURCE=$1 SEED=$2 NAME=$3
shift 3
DIR="${GUIDED_DIR:-runs/guided}"
BIN="${BIN:-target/release}"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/rubricem}"
# shellcheck source=/dev/null
source scripts/torch-env.sh
DTYPE="${GUIDED_DTYPE:-auto}"
if [[ "$DTYPE" == auto ]]; then DTYPE=$("$BIN/trainer" info --cpu-dtype); fi

OUT="$DIR/average/$NAME"
mkdir -p "$OUT/model"
CKPTS=()
for v in "$@"; do
  if [[ ! "$v" =~ ^[0-9]+$ ]]; then
    say "version $v is not a policy version number"
    exit 2
  fi
  rel=$(psql "$DATABASE_URL" -Atq -v exp="$SOURCE" -v seed="$SEED" -v v="$v" <<'SQL'
SELECT c.path FROM checkpoints c JOIN runs r ON r.id = c.run_id
JOIN experiments e ON e.id = r.experiment_id
WHERE (e.name = :'exp' OR e.id::text = :'exp') AND r.seed = :'seed'::int
  AND c.policy_version = :'v'::int
ORDER BY c.created_at DESC LIMIT 1;
SQL
  )
  if [[ -z "$rel" ]]; then
    say "experiment $SOURCE seed $SEED has no checkpoint of version $v"
    exit 1
  fi
  path="$DIR/rl/a/checkpoints/$rel"
  [[ -d "$path" ]] || path="$DIR/rl/b/checkpoints/$rel"
  [[ -d "$path" ]] || { say "checkpoint $rel is under neither $DIR/rl/a nor $DIR/rl/b"; exit 1; }
  CKPTS+=("$path")
done
for f in config.json generation_config.json tokenizer.json tokenizer_config.json; do
  [[ -f "$DIR/model-sft/$f" ]] && cp "$DIR/model-sft/$f" "$OUT/model/"
done
"$BIN/trainer" average --out "$OUT/model/model.safetensors" "${CKPTS[@]}" >"$OUT/average.json"
say "averaged versions $* of $SOURCE seed $SEED into $OUT/model ($DTYPE)"

export TRAINER_DTYPE="$DTYPE"
ABLATION_EXPERIMENT=guided ABLATION_DIR="$OUT/rl" ABLATION_MODEL="$OUT/model" BIN="$BIN" \
  ABLATION_PAIRS=1 ABLATION_ARGS="--set trainer.param_dtype=$DTYPE --set experiment.name=$NAME \
  --set experiment.seeds=[$SEED] --set experiment.steps=1" bash scripts/ablation-mini.sh

# The mean (v0 of experiment NAME) against the source run's first and last evaluated versions.
psql "$DATABASE_URL" -q -v exp="$SOURCE" -v seed="$SEED" -v name="$NAME" <<'SQL'
WITH src AS (
    SELECT r.id FROM runs r JOIN experiments e ON e.id = r.experiment_id
    WHERE (e.name = :'exp' OR e.id::text = :'exp') AND r.seed = :'seed'::int
    ORDER BY r.created_at DESC LIMIT 1
), mean AS (
    SELECT ev.subset, ev.score FROM evaluations ev JOIN runs r ON r.id = ev.run_id
    WHERE r.experiment_id = (SELECT id FROM experiments WHERE name = :'name'
                             ORDER BY created_at DESC LIMIT 1)
      AND r.seed = :'seed'::int AND ev.policy_version = 0
), ends AS (
    SELECT ev.subset,
           min(ev.policy_version) AS first_v,
           max(ev.policy_version) AS last_v
    FROM evaluations ev WHERE ev.run_id = (SELECT id FROM src) GROUP BY ev.subset
)
SELECT s.subset,
       round(f.score::numeric, 3)                 AS run_v0,
       l.policy_version                            AS last_version,
       round((l.score - f.score)::numeric, 3)     AS last_change,
       round((m.score - f.score)::numeric, 3)     AS mean_change
FROM ends s
JOIN evaluations f ON f.run_id = (SELECT id FROM src) AND f.subset = s.subset
     AND f.policy_version = s.first_v
JOIN evaluations l ON l.run_id = (SELECT id FROM src) AND l.subset = s.subset
     AND l.policy_version = s.last_v
LEFT JOIN mean m ON m.subset = s.subset
ORDER BY s.subset;
SQL
