-- Tool use per stage: calls per run, step, stage and tool, with errors, cache hits and latency.
-- calls_per_trajectory divides by the step's trajectory count (trajectories with no call count).
WITH per_step AS (
    SELECT run_id, step, count(*) AS trajectories
    FROM trajectories
    GROUP BY run_id, step
)
SELECT t.run_id,
       t.step,
       coalesce(st.name, 'none')                                   AS stage,
       tc.tool,
       count(*)                                                    AS calls,
       (count(*)::float8 / max(ps.trajectories))                   AS calls_per_trajectory,
       count(*) FILTER (WHERE tc.error IS NOT NULL)                AS errors,
       count(*) FILTER (WHERE tc.cached)                           AS cache_hits,
       avg(tc.latency_ms)::float8                                  AS mean_latency_ms
FROM tool_calls tc
JOIN trajectories t ON t.id = tc.trajectory_id
JOIN per_step ps    ON ps.run_id = t.run_id AND ps.step = t.step
LEFT JOIN stages st ON st.id = tc.stage
GROUP BY t.run_id, t.step, st.id, st.name, tc.tool
ORDER BY t.run_id, t.step, st.id NULLS LAST, tc.tool;
