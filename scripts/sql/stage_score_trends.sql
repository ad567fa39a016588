-- Stage score trends: mean stage score R (0..1) per run, step and stage, with its spread.
-- The judge column says which judge produced the scores (LLM model name or the lexical judge).
SELECT t.run_id,
       r.name                         AS run,
       ss.judge_model                 AS judge,
       t.step,
       st.name                        AS stage,
       avg(ss.score)::float8          AS mean_score,
       stddev_pop(ss.score)::float8   AS std_score,
       count(*)                       AS trajectories
FROM stage_scores ss
JOIN trajectories t ON t.id = ss.trajectory_id
JOIN runs r         ON r.id = t.run_id
JOIN stages st      ON st.id = ss.stage
GROUP BY t.run_id, r.name, ss.judge_model, t.step, st.id, st.name
ORDER BY t.run_id, ss.judge_model, t.step, st.id;
