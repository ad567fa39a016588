-- Citation validity per run and step: how many citations in final answers resolve to a snippet
-- the trajectory actually retrieved. The parser stores parsed.citations as
-- [{"id": "<snippet id>", "known": true|false}, ...].
WITH cites AS (
    SELECT t.run_id, t.step, t.id AS trajectory_id, c.value AS citation
    FROM trajectories t
    LEFT JOIN LATERAL jsonb_array_elements(
        CASE WHEN jsonb_typeof(t.parsed -> 'citations') = 'array' THEN t.parsed -> 'citations'
             ELSE '[]'::jsonb END) AS c(value) ON true
)
SELECT run_id,
       step,
       count(DISTINCT trajectory_id)                                     AS trajectories,
       count(citation)                                                   AS citations,
       count(citation) FILTER (WHERE (citation ->> 'known')::boolean)    AS valid_citations,
       (count(citation) FILTER (WHERE (citation ->> 'known')::boolean))::float8
           / nullif(count(citation), 0)                                  AS valid_fraction,
       count(DISTINCT trajectory_id) FILTER (WHERE citation IS NULL)     AS trajectories_without_citations
FROM cites
GROUP BY run_id, step
ORDER BY run_id, step;
