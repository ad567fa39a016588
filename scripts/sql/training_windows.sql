-- Training in windows of steps: per run and window (`window_steps` consecutive steps, 12 below;
-- edit the `params` row for another width), the step range, the mean answer reward, the attempts
-- rolled out and how they ended (stopped in a loop by `rollout.repetition_detection`, cut at the
-- token budget), parse failures, the teacher's demonstrations added (`credit.guidance_demos`),
-- the rows per step sent to the trainer and how many carried no gradient (`trainer.skip_null_rows`),
-- and the mean seconds per step of training and of rollout.
-- Issue 25 read every learning run this way (BENCHMARKS.md, "per window of 12 steps"): a window
-- whose answer reward stalls while loop stops climb is the failure mode it names.
-- Counts are sums over the window's steps (a step that rolled out and recorded no loop stop or
-- cut counts zero of them); a metric a run never records (no guidance, an older trainer) reads
-- NULL, not zero.
WITH params AS (
    SELECT 12 AS window_steps
),
per_step AS (
    SELECT m.run_id,
           m.step,
           m.step / p.window_steps AS win,
           max(m.value) FILTER (WHERE m.name = 'reward/answer')             AS answer_reward,
           max(m.value) FILTER (WHERE m.name = 'rollout/trajectories')      AS attempts,
           -- the rollout records a finish reason only when some attempt ended that way
           CASE WHEN bool_or(m.name = 'rollout/trajectories') THEN
               coalesce(max(m.value) FILTER (WHERE m.name = 'rollout/finish/repetition'), 0)
           END                                                               AS loop_stops,
           CASE WHEN bool_or(m.name = 'rollout/trajectories') THEN
               coalesce(max(m.value) FILTER (WHERE m.name = 'rollout/finish/length'), 0)
           END                                                               AS budget_cuts,
           max(m.value) FILTER (WHERE m.name = 'rollout/parse_failures')    AS parse_failures,
           max(m.value) FILTER (WHERE m.name = 'rollout/guidance')          AS demonstrations,
           max(m.value) FILTER (WHERE m.name = 'batch/sequences')           AS rows_sent,
           max(m.value) FILTER (WHERE m.name = 'train/null_sequences')      AS null_rows,
           max(m.value) FILTER (WHERE m.name = 'time/train_s')              AS train_s,
           max(m.value) FILTER (WHERE m.name = 'time/rollout_s')            AS rollout_s
    FROM step_metrics m
    CROSS JOIN params p
    GROUP BY m.run_id, m.step, p.window_steps
)
SELECT r.id                                    AS run_id,
       e.name                                  AS experiment,
       r.recipe,
       r.seed,
       ps.win                                  AS "window",
       min(ps.step)                            AS first_step,
       max(ps.step)                            AS last_step,
       count(*)                                AS steps,
       avg(ps.answer_reward)::float8           AS answer_reward,
       sum(ps.attempts)::float8                AS attempts,
       sum(ps.loop_stops)::float8              AS loop_stops,
       sum(ps.budget_cuts)::float8             AS budget_cuts,
       sum(ps.parse_failures)::float8          AS parse_failures,
       sum(ps.demonstrations)::float8          AS demonstrations,
       avg(ps.rows_sent)::float8               AS rows_per_step,
       avg(ps.null_rows)::float8               AS null_rows_per_step,
       avg(ps.train_s)::float8                 AS train_s_per_step,
       avg(ps.rollout_s)::float8               AS rollout_s_per_step
FROM per_step ps
JOIN runs r        ON r.id = ps.run_id
JOIN experiments e ON e.id = r.experiment_id
GROUP BY r.id, e.name, r.recipe, r.seed, ps.win
ORDER BY e.name, r.recipe, r.seed, r.id, ps.win;
