-- Training time per run on the wall clock, with the evaluations it ran in between left out: the
-- figure issue 25 holds against the smoke budget (about 15 minutes of RL on the 2-core machine).
-- The span runs from the first to the last step's `time/train_s` record, so it leaves out the
-- first step's own rollout and training (recorded when it ends) and every evaluation before the
-- first step (v0) or after the last (the final version's). An evaluation whose record
-- (`evaluations.created_at`, written when it ends) falls inside the span held the next train step
-- back for about its `seconds` (the pipeline lets rollouts go on beside it, but not training), so
-- `rl_minutes` subtracts them; `span_minutes` keeps them. Session 77's rule subtracted only its
-- v24 evaluations from a span that ran to the last step metric, which is written after the final
-- evaluation (BENCHMARKS.md, issue 25 sessions 77 and 78); this query's span ends before it.
-- Seconds per step divide the span less its evaluations by the steps after the first.
WITH train AS (
    SELECT run_id,
           count(DISTINCT step) AS steps,
           min(recorded_at)     AS first_at,
           max(recorded_at)     AS last_at
    FROM step_metrics
    WHERE name = 'time/train_s'
    GROUP BY run_id
),
inside AS (
    SELECT t.run_id,
           count(DISTINCT ev.policy_version) AS evaluated_versions,
           coalesce(sum(ev.seconds), 0)      AS eval_s
    FROM train t
    LEFT JOIN evaluations ev
           ON ev.run_id = t.run_id
          AND ev.created_at > t.first_at
          AND ev.created_at < t.last_at
    GROUP BY t.run_id
)
SELECT r.id                                                              AS run_id,
       e.name                                                            AS experiment,
       r.recipe,
       r.seed,
       t.steps,
       (extract(epoch FROM t.last_at - t.first_at) / 60)::float8         AS span_minutes,
       i.evaluated_versions,
       (i.eval_s / 60)::float8                                           AS eval_minutes_inside,
       ((extract(epoch FROM t.last_at - t.first_at) - i.eval_s) / 60)::float8 AS rl_minutes,
       CASE WHEN t.steps > 1 THEN
           ((extract(epoch FROM t.last_at - t.first_at) - i.eval_s) / (t.steps - 1))::float8
       END                                                               AS seconds_per_step
FROM train t
JOIN inside i      ON i.run_id = t.run_id
JOIN runs r        ON r.id = t.run_id
JOIN experiments e ON e.id = r.experiment_id
ORDER BY e.name, r.recipe, r.seed, r.id;
