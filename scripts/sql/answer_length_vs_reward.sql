-- Answer length vs reward: per run, trajectories split into length quartiles by their Answer-stage
-- model tokens, with the mean Answer-stage score per quartile and the run-wide Pearson
-- correlation (a rising curve with a high correlation is the classic length-hacking signature).
WITH answer AS (
    SELECT t.run_id,
           t.id AS trajectory_id,
           coalesce(sum(cardinality(s.token_ids)) FILTER (WHERE s.kind = 'model' AND s.stage = 3), 0)
               AS answer_tokens
    FROM trajectories t
    LEFT JOIN trajectory_segments s ON s.trajectory_id = t.id
    GROUP BY t.run_id, t.id
),
scored AS (
    SELECT a.run_id, a.answer_tokens, ss.score::float8 AS reward, ss.judge_model,
           ntile(4) OVER (PARTITION BY a.run_id, ss.judge_model ORDER BY a.answer_tokens, a.trajectory_id)
               AS length_quartile
    FROM answer a
    JOIN stage_scores ss ON ss.trajectory_id = a.trajectory_id AND ss.stage = 3
),
corr_by_run AS (
    SELECT run_id, judge_model, corr(answer_tokens, reward) AS length_reward_corr
    FROM scored GROUP BY run_id, judge_model
)
SELECT s.run_id,
       s.judge_model                    AS judge,
       s.length_quartile,
       count(*)                         AS trajectories,
       avg(s.answer_tokens)::float8     AS mean_answer_tokens,
       avg(s.reward)::float8            AS mean_reward,
       c.length_reward_corr
FROM scored s
JOIN corr_by_run c ON c.run_id = s.run_id AND c.judge_model = s.judge_model
GROUP BY s.run_id, s.judge_model, s.length_quartile, c.length_reward_corr
ORDER BY s.run_id, s.judge_model, s.length_quartile;
