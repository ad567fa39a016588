#!/usr/bin/env bash
# Does the rubric bank's `<reference_examples>` block change how the policy's attempts end?
# (issue 25, session 40). One model, one task file, one bank: `orchestrator rollout` rolls the
# same tasks out under each injection (none, the top 1 cross-task item, the top 2, the task's own
# item where the bank holds one), each as its own one-step rollout run with the same seed, then
# one query prints, per injection, the attempts, the share cut at the token budget
# (finish_reason = length), answered, forced, the share whose answer holds the task's known answer
# (tasks with one: the world's exact tasks; a whole-word, case-blind match, as the evaluations'
# exact match), the prompt and model tokens, and paired against `none`: tasks cut under the block
# but not without it, and the other way.
#
#   usage: probe-injection.sh MODEL BANK_RUN TASKS INDEX [OUT]
#   MODEL     a model directory `trainer serve` loads (its tokenizer is the rollout's)
#   BANK_RUN  the run whose rubric bank is injected (`orchestrator bank show RUN`)
#   TASKS     a task file (JSONL); INDEX the world's local index
#   OUT       logs and summaries (default runs/probe-injection)
#   PROBE_N        attempts per task (default 1); PROBE_LIMIT the first N tasks (default 64)
#   PROBE_MODES    injections, space-separated, from none, cross1, cross2, within
#                  (default "none cross1 cross2")
#   PROBE_SETS     extra `--set KEY=VALUE` overrides, ';'-separated, applied to every rollout
#                  (e.g. the run's reflection.max_item_chars)
#   PROBE_EXPERIMENT  the preset (default ablation-mini: the budgets the runs train under)
#   PROBE_PORT     the policy server's port (default 8950); BIN the binaries (target/release)
# Each injection is its own rollout run; the summary reads them by the run ids the rollouts print.
set -euo pipefail
if (($# < 4)); then
  sed -n '2,22p' "$0" >&2  # the usage above
  exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="$1" BANK="$2" TASKS="$3" INDEX="$4" OUT="${5:-runs/probe-injection}"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/rubricem}"
N="${PROBE_N:-1}" LIMIT="${PROBE_LIMIT:-64}" PORT="${PROBE_PORT:-8950}"
EXPERIMENT="${PROBE_EXPERIMENT:-ablation-mini}"
BIN="${BIN:-$ROOT/target/release}"
say() { echo "probe-injection: $*" >&2; }
[[ "$BANK" =~ ^[0-9a-f-]{36}$ ]] || { say "BANK_RUN = $BANK is not a run id (a UUID)"; exit 2; }
[[ -f "$MODEL/model.safetensors" ]] || { say "no model at $MODEL"; exit 2; }
[[ -f "$TASKS" ]] || { say "no task file at $TASKS"; exit 2; }
source "$ROOT/scripts/torch-env.sh"
mkdir -p "$OUT"
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
source "$ROOT/scripts/servers.sh"
start_server "$PORT" "$OUT/policy.log" --model "$MODEL" --threads 2 --device cpu

SETS=()
IFS=';' read -ra EXTRA <<<"${PROBE_SETS:-}"
for s in "${EXTRA[@]}"; do [[ -n "$s" ]] && SETS+=(--set "$s"); done
RUNS=()
for mode in ${PROBE_MODES:-none cross1 cross2}; do
  case "$mode" in
    none) reuse=(--reuse none) ;;
    cross1) reuse=(--reuse cross --bank-run "$BANK" --set reflection.top_k=1) ;;
    cross2) reuse=(--reuse cross --bank-run "$BANK" --set reflection.top_k=2) ;;
    within) reuse=(--reuse within --bank-run "$BANK") ;;
    *) say "PROBE_MODES holds $mode; allowed: none, cross1, cross2, within"; exit 2 ;;
  esac
  say "$mode: $LIMIT tasks x $N"
  "$BIN/orchestrator" rollout --experiment "$EXPERIMENT" --policy-url "http://127.0.0.1:$PORT" \
    --tasks "$TASKS" --limit "$LIMIT" --n "$N" --tokenizer "$MODEL" --index "$INDEX" \
    --max-inflight 8 "${SETS[@]}" "${reuse[@]}" >"$OUT/$mode.txt" 2>"$OUT/$mode.log"
  run=$(grep -ao '^run [0-9a-f-]*' "$OUT/$mode.txt" | awk '{print $2}')
  [[ -n "$run" ]] || { say "no run id in $OUT/$mode.txt; see $OUT/$mode.log"; exit 1; }
  cat "$OUT/$mode.txt"
  RUNS+=("$mode=$run")
done

# One query over the runs: modes and ids are this script's own, validated above.
VALUES=""
for r in "${RUNS[@]}"; do VALUES+="${VALUES:+,}('${r%%=*}', '${r#*=}'::uuid)"; done
psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -q <<SQL | tee "$OUT/summary.txt"
-- words(): lower case, runs of non-alphanumerics and the articles a/an/the dropped, one space
-- between words (domain/eval/answer.rs's rule, which the evaluations' exact match uses).
CREATE FUNCTION pg_temp.words(text) RETURNS text LANGUAGE sql IMMUTABLE AS \$\$
  SELECT coalesce(string_agg(w, ' '), '') FROM regexp_split_to_table(lower(\$1), '[^[:alnum:]]+') w
  WHERE w NOT IN ('', 'a', 'an', 'the') \$\$;
WITH m(mode, run) AS (VALUES $VALUES),
t AS (SELECT m.mode, tr.task_id, tr.sample_index, tr.finish_reason,
             cardinality(tr.prompt_token_ids) AS prompt, tr.num_model_tokens AS gen,
             CASE WHEN tk.metadata->>'answer' <> '' THEN
               ' ' || pg_temp.words(coalesce(tr.parsed->>'boxed', tr.parsed->>'answer', '')) || ' '
               LIKE '% ' || pg_temp.words(tk.metadata->>'answer') || ' %' END AS exact
      FROM m JOIN trajectories tr ON tr.run_id = m.run JOIN tasks tk ON tk.id = tr.task_id),
base AS (SELECT task_id, sample_index, finish_reason FROM t WHERE mode = 'none')
SELECT t.mode, count(*) AS attempts,
       round(avg((t.finish_reason = 'length')::int), 3) AS cut,
       round(avg((t.finish_reason = 'answer')::int), 3) AS answered,
       round(avg((t.finish_reason = 'forced_answer')::int), 3) AS forced,
       round(avg(t.exact::int), 3) AS exact,
       round(avg(t.prompt)) AS prompt_tokens, round(avg(t.gen)) AS model_tokens,
       count(*) FILTER (WHERE t.finish_reason = 'length' AND b.finish_reason <> 'length')
         AS cut_only_here,
       count(*) FILTER (WHERE t.finish_reason <> 'length' AND b.finish_reason = 'length')
         AS cut_only_without
FROM t LEFT JOIN base b USING (task_id, sample_index)
GROUP BY t.mode ORDER BY min(t.prompt);
SQL
