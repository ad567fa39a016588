-- Budget cuts by task length: per run and the task's `hops` (tasks.metadata; 'none' when the
-- task has no such field), the share of trajectories cut before their answer over the first half
-- of the run's steps and over the second half: run to the token budget (finish_reason =
-- 'length') or stopped in a loop by `rollout.repetition_detection` ('repetition', which would
-- otherwise have run to the budget).
-- Issue 25 found the bank recipes' cuts climbing on four-hop tasks in the second half; a share
-- that climbs on long tasks only, in one recipe only, is that pattern.
WITH per_run AS (
    SELECT run_id, max(step) AS last_step
    FROM trajectories
    GROUP BY run_id
),
tagged AS (
    SELECT t.run_id,
           coalesce(tk.metadata ->> 'hops', 'none')       AS hops,
           (2 * t.step > pr.last_step)                    AS late,
           (t.finish_reason IN ('length', 'repetition')) AS cut
    FROM trajectories t
    JOIN per_run pr ON pr.run_id = t.run_id
    JOIN tasks tk   ON tk.id = t.task_id
)
SELECT r.id                                                        AS run_id,
       e.name                                                      AS experiment,
       r.recipe,
       r.seed,
       tg.hops,
       count(*) FILTER (WHERE NOT tg.late)                         AS early_trajectories,
       (avg(tg.cut::int) FILTER (WHERE NOT tg.late))::float8       AS early_cut_share,
       count(*) FILTER (WHERE tg.late)                             AS late_trajectories,
       (avg(tg.cut::int) FILTER (WHERE tg.late))::float8           AS late_cut_share
FROM tagged tg
JOIN runs r        ON r.id = tg.run_id
JOIN experiments e ON e.id = r.experiment_id
GROUP BY r.id, e.name, r.recipe, r.seed, tg.hops
ORDER BY e.name, r.recipe, r.seed, r.id, tg.hops;
