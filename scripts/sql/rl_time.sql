-- Training time per run on the wall clock, with the evaluations it ran in between left out: the
-- figure issue 25 holds against the smoke budget (about 15 minutes of RL on the 2-core machine).
-- The span runs from the first to the last step's `time/train_s` record, so it leaves out the
-- first step's own rollout and training (recorded when it ends), the v0 evaluation before it and
-- the final version's after it. An evaluation of the version step s made runs after step s's
-- `time/train_s` record and holds step s + 1's training back (the pipeline lets rollouts go on
-- beside it, not training); the pipeline records its whole wall time, every subset and benchmark
-- set included, as `time/eval_s` on step s. `rl_minutes` subtracts those of the steps before the
-- last (the last step's is the final evaluation, outside the span); `span_minutes` keeps them.
-- On `guided` they equal the `evaluations.seconds` of that version's subsets summed (BENCHMARKS.md,
-- issue 25 session 78). A run that crashed and resumed counts its downtime, and any evaluation
-- redone on resume, inside the span. Session 77's rule subtracted only its v24 evaluations from a
-- span that ran to the last step metric, the final evaluation's `time/eval_s`, so it held that
-- evaluation too; this query's span ends before it. Seconds per step divide the span less its
-- evaluations by the steps after the first.
WITH train AS (
    SELECT run_id,
           count(DISTINCT step) AS steps,
           min(step)            AS first_step,
           max(step)            AS last_step,
           min(recorded_at)     AS first_at,
           max(recorded_at)     AS last_at
    FROM step_metrics
    WHERE name = 'time/train_s'
    GROUP BY run_id
),
inside AS (
    SELECT t.run_id,
           count(m.step)               AS evaluated_versions,
           coalesce(sum(m.value), 0)   AS eval_s
    FROM train t
    LEFT JOIN step_metrics m
           ON m.run_id = t.run_id
          AND m.name = 'time/eval_s'
          AND m.step >= t.first_step
          AND m.step < t.last_step
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
