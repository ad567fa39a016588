-- Rubric score variance: for each rubric, the population variance of its 0/1/2 scores across
-- the trajectories judged at one step (the GRPO group). Zero-variance rubrics carry no learning
-- signal and are what buffer pruning removes first.
SELECT t.run_id,
       t.step,
       st.name                     AS stage,
       ru.id                       AS rubric_id,
       ru.negative,
       left(ru.description, 80)    AS rubric,
       j.judge_model               AS judge,
       count(*)                    AS judged,
       avg(j.score)::float8        AS mean_score,
       var_pop(j.score)::float8    AS variance
FROM judgments j
JOIN trajectories t ON t.id = j.trajectory_id
JOIN rubrics ru     ON ru.id = j.rubric_id
JOIN stages st      ON st.id = j.stage
GROUP BY t.run_id, t.step, st.id, st.name, ru.id, ru.negative, ru.description, j.judge_model
ORDER BY t.run_id, t.step, st.id, variance DESC, ru.id;
