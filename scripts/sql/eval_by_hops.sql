-- Evaluations by task length: per run, evaluation subset, policy version and the task's `hops`
-- (tasks.metadata; 'none' when the task has no such field), how many answers there are, their
-- mean score (over the answers with one: a judge that failed after its retries leaves NULL, and
-- an answer cut at the budget is scored like any other), how many were exact of those with a
-- known short answer, how many were cut (finish_reason 'length': the token budget, or
-- 'repetition': a loop stop, `rollout.repetition_detection`), the mean tool calls, and the
-- share of rubric items the lexical judge lowered one level because the answer cites ids it
-- never retrieved (its justification says so; other judges write no such note and give 0).
-- Issue 25 (session 46) read where a held-out change comes from with it: two-hop answers that
-- learned to copy their documents' ids, four-hop reports that stay cut at the budget.
SELECT r.id                                                          AS run_id,
       e.name                                                        AS experiment,
       r.recipe,
       r.seed,
       er.subset,
       er.policy_version,
       coalesce(tk.metadata ->> 'hops', 'none')                      AS hops,
       count(*)                                                      AS answers,
       avg(er.score)::float8                                         AS mean_score,
       count(*) FILTER (WHERE er.exact)                              AS exact,
       count(er.exact)                                               AS exact_known,
       count(*) FILTER (WHERE er.finish_reason IN ('length', 'repetition'))
                                                                     AS cut,
       avg(er.tool_calls)::float8                                    AS tool_calls,
       (avg((SELECT count(*)
             FROM jsonb_array_elements(er.rubric_scores) AS item
             WHERE item ->> 'justification' LIKE '%cites ids never retrieved%')::float8
            / greatest(jsonb_array_length(er.rubric_scores), 1)))::float8
                                                                     AS uncited_lowered_share
FROM evaluation_results er
JOIN runs r        ON r.id = er.run_id
JOIN experiments e ON e.id = r.experiment_id
JOIN tasks tk      ON tk.id = er.task_id
GROUP BY r.id, e.name, r.recipe, r.seed, er.subset, er.policy_version, hops
ORDER BY e.name, r.recipe, r.seed, r.id, er.subset, hops, er.policy_version;
