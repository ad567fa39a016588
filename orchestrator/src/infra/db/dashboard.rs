//! Read-only queries behind `orchestrator dashboard`. Each returns one JSON document built by
//! Postgres (`json_agg`/`json_build_object`) as text, which the server sends unchanged: one
//! round trip per page, no row-by-row decoding, so a 600-step run's metrics page stays well
//! under its time budget (BENCHMARKS.md). Nothing here writes.

use sqlx::PgPool;
use uuid::Uuid;

use super::DbError;

/// Every run with its experiment, status, progress and an ETA from the observed step rate
/// (`(steps - completed) x (last finish - first start) / completed` while running).
pub async fn runs(pool: &PgPool) -> Result<String, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(json_agg(x ORDER BY x.created_at DESC, x.id), '[]')::text FROM (
           SELECT r.id, r.name, r.recipe, r.status, r.seed, r.error, r.created_at, r.updated_at,
                  r.finished_at, e.id AS experiment_id, e.name AS experiment, e.preset,
                  (r.config->'experiment'->>'steps')::int AS steps,
                  s.completed, s.first_started, s.last_finished,
                  CASE WHEN r.status = 'running' AND s.completed > 0
                       THEN greatest((r.config->'experiment'->>'steps')::int - s.completed, 0)
                            * extract(epoch FROM s.last_finished - s.first_started) / s.completed
                  END AS eta_s
           FROM runs r
           JOIN experiments e ON e.id = r.experiment_id
           LEFT JOIN LATERAL (
             SELECT count(*) FILTER (WHERE st.status = 'completed') AS completed,
                    min(st.started_at) AS first_started,
                    max(st.finished_at) FILTER (WHERE st.status = 'completed') AS last_finished
             FROM steps st WHERE st.run_id = r.id
           ) s ON true
         ) x",
    )
    .fetch_one(pool)
    .await?)
}

/// One run: its row, resolved configuration, experiment, steps and checkpoints; `None` when
/// no such run exists.
pub async fn run(pool: &PgPool, run_id: Uuid) -> Result<Option<String>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT json_build_object(
           'id', r.id, 'name', r.name, 'recipe', r.recipe, 'status', r.status, 'seed', r.seed,
           'error', r.error, 'created_at', r.created_at, 'updated_at', r.updated_at,
           'finished_at', r.finished_at, 'config', r.config,
           'trainer_settings', r.trainer_settings,
           'experiment', json_build_object('id', e.id, 'name', e.name, 'preset', e.preset),
           'steps', (SELECT coalesce(json_agg(json_build_object(
                        'step', st.step, 'policy_version', st.policy_version,
                        'status', st.status, 'started_at', st.started_at,
                        'finished_at', st.finished_at,
                        'seconds', extract(epoch FROM st.finished_at - st.started_at))
                        ORDER BY st.step), '[]')
                     FROM steps st WHERE st.run_id = r.id),
           'checkpoints', (SELECT coalesce(json_agg(json_build_object(
                        'step', c.step, 'policy_version', c.policy_version, 'kind', c.kind,
                        'path', c.path, 'created_at', c.created_at) ORDER BY c.step), '[]')
                     FROM checkpoints c WHERE c.run_id = r.id)
         )::text
         FROM runs r JOIN experiments e ON e.id = r.experiment_id WHERE r.id = $1",
    )
    .bind(run_id)
    .fetch_optional(pool)
    .await?)
}

/// A run's step metrics from step `since` on, as `{name: [[step, value], ...]}` (steps
/// ascending): the live page asks for the tail it has not seen yet.
pub async fn metrics(pool: &PgPool, run_id: Uuid, since: i32) -> Result<String, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(json_object_agg(name, pts), '{}')::text FROM (
           SELECT name, json_agg(json_build_array(step, value) ORDER BY step) AS pts
           FROM step_metrics WHERE run_id = $1 AND step >= $2 GROUP BY name
         ) m",
    )
    .bind(run_id)
    .bind(since)
    .fetch_one(pool)
    .await?)
}

/// The runs of an experiment with one metric each, for overlaying recipes:
/// `{experiment, runs: [{id, name, recipe, status, points: [[step, value], ...]}]}`.
pub async fn experiment_metric(
    pool: &PgPool,
    experiment_id: Uuid,
    name: &str,
) -> Result<Option<String>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT json_build_object(
           'id', e.id, 'name', e.name, 'preset', e.preset, 'metric', $2::text,
           'metrics', (SELECT coalesce(json_agg(DISTINCT m.name), '[]') FROM step_metrics m
                       JOIN runs r ON r.id = m.run_id WHERE r.experiment_id = e.id),
           'runs', (SELECT coalesce(json_agg(json_build_object(
                      'id', r.id, 'name', r.name, 'recipe', r.recipe, 'status', r.status,
                      'seed', r.seed,
                      'points', (SELECT coalesce(json_agg(json_build_array(m.step, m.value)
                                   ORDER BY m.step), '[]')
                                 FROM step_metrics m WHERE m.run_id = r.id AND m.name = $2))
                      ORDER BY r.created_at, r.id), '[]')
                    FROM runs r WHERE r.experiment_id = e.id)
         )::text
         FROM experiments e WHERE e.id = $1",
    )
    .bind(experiment_id)
    .bind(name)
    .fetch_optional(pool)
    .await?)
}

/// Evaluations of a run: the held-out/subset evaluations per policy version and the benchmark
/// runs graded by gold judges at its versions.
pub async fn evaluations(pool: &PgPool, run_id: Uuid) -> Result<String, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT json_build_object(
           'subsets', (SELECT coalesce(json_agg(json_build_object(
                         'policy_version', v.policy_version, 'subset', v.subset,
                         'judge_model', v.judge_model, 'tasks', v.tasks, 'samples', v.samples,
                         'score', v.score, 'exact', v.exact, 'judged', v.judged,
                         'failed', v.failed, 'parse_failures', v.parse_failures,
                         'judge_cost_usd', v.judge_cost_usd, 'seconds', v.seconds)
                         ORDER BY v.subset, v.policy_version), '[]')
                       FROM evaluations v WHERE v.run_id = $1),
           'benchmarks', (SELECT coalesce(json_agg(json_build_object(
                         'name', b.name, 'benchmark', b.benchmark,
                         'policy_version', b.policy_version, 'status', b.status,
                         'summary', b.summary) ORDER BY b.policy_version, b.name), '[]')
                       FROM bench_runs b WHERE b.source_run_id = $1)
         )::text",
    )
    .bind(run_id)
    .fetch_one(pool)
    .await?)
}

/// The trajectories of one step, grouped by task: each with its reward, per-stage scores and
/// advantages, finish reason, token counts and tool calls.
pub async fn step(pool: &PgPool, run_id: Uuid, step: i32) -> Result<String, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(json_agg(g ORDER BY g.first_sample, g.task_id), '[]')::text FROM (
           SELECT t.task_id, min(k.external_id) AS external_id, min(left(k.prompt, 300)) AS prompt,
                  min(t.sample_index) AS first_sample,
                  json_agg(json_build_object(
                    'id', t.id, 'sample_index', t.sample_index,
                    'policy_version', t.policy_version, 'finish_reason', t.finish_reason,
                    'model_tokens', t.num_model_tokens, 'tool_tokens', t.num_tool_tokens,
                    'parse_issues', coalesce(jsonb_array_length(t.parsed->'issues'), 0),
                    'tool_calls', (SELECT count(*) FROM tool_calls c WHERE c.trajectory_id = t.id),
                    'reward', (SELECT w.reward FROM trajectory_rewards w
                               WHERE w.trajectory_id = t.id ORDER BY w.created_at DESC LIMIT 1),
                    'stages', (SELECT coalesce(json_agg(json_build_object(
                                 'stage', sg.name, 'score', s.score, 'advantage', s.advantage,
                                 'source', s.source) ORDER BY s.stage), '[]')
                               FROM stage_scores s JOIN stages sg ON sg.id = s.stage
                               WHERE s.trajectory_id = t.id))
                    ORDER BY t.sample_index) AS trajectories
           FROM trajectories t JOIN tasks k ON k.id = t.task_id
           WHERE t.run_id = $1 AND t.step = $2
           GROUP BY t.task_id
         ) g",
    )
    .bind(run_id)
    .bind(step)
    .fetch_one(pool)
    .await?)
}

/// One trajectory for the viewer: the task, every segment (text, kind, stage, token count,
/// no token ids), tool calls with outputs, parsed scaffold, judgments with each rubric's text,
/// stage scores and advantages, rewards, and the other members of its group.
pub async fn trajectory(pool: &PgPool, id: Uuid) -> Result<Option<String>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT json_build_object(
           'id', t.id, 'run_id', t.run_id, 'run', r.name, 'recipe', r.recipe, 'step', t.step,
           'sample_index', t.sample_index, 'policy_version', t.policy_version,
           'server', t.server, 'finish_reason', t.finish_reason, 'parsed', t.parsed,
           'timings', t.timings, 'model_tokens', t.num_model_tokens,
           'tool_tokens', t.num_tool_tokens,
           'prompt_tokens', cardinality(t.prompt_token_ids),
           'task', json_build_object('id', k.id, 'source', k.source,
                     'external_id', k.external_id, 'prompt', k.prompt,
                     'answer_format', k.answer_format),
           'segments', (SELECT coalesce(json_agg(json_build_object(
                          'ordinal', s.ordinal, 'kind', s.kind, 'stage', sg.name,
                          'tokens', cardinality(s.token_ids), 'text', s.text,
                          'policy_version', s.policy_version) ORDER BY s.ordinal), '[]')
                        FROM trajectory_segments s LEFT JOIN stages sg ON sg.id = s.stage
                        WHERE s.trajectory_id = t.id),
           'tool_calls', (SELECT coalesce(json_agg(json_build_object(
                          'ordinal', c.ordinal, 'stage', sg.name, 'tool', c.tool,
                          'arguments', c.arguments, 'output', c.output_text,
                          'snippet_ids', c.snippet_ids, 'error', c.error, 'cached', c.cached,
                          'latency_ms', c.latency_ms) ORDER BY c.ordinal), '[]')
                        FROM tool_calls c LEFT JOIN stages sg ON sg.id = c.stage
                        WHERE c.trajectory_id = t.id),
           'judgments', (SELECT coalesce(json_agg(json_build_object(
                          'stage', sg.name, 'rubric_id', j.rubric_id, 'title', u.title,
                          'description', u.description, 'weight', u.weight,
                          'negative', u.negative, 'origin', u.origin, 'score', j.score,
                          'justification', j.justification, 'judge_model', j.judge_model,
                          'judge_kind', j.judge_kind, 'fallback', j.fallback)
                          ORDER BY j.stage, u.weight DESC, u.title), '[]')
                        FROM judgments j JOIN rubrics u ON u.id = j.rubric_id
                        JOIN stages sg ON sg.id = j.stage
                        WHERE j.trajectory_id = t.id),
           'stage_scores', (SELECT coalesce(json_agg(json_build_object(
                          'stage', sg.name, 'judge_model', s.judge_model, 'score', s.score,
                          'return', s.stage_return, 'advantage', s.advantage,
                          'source', s.source, 'judge_kind', s.judge_kind)
                          ORDER BY s.judge_model, s.stage), '[]')
                        FROM stage_scores s JOIN stages sg ON sg.id = s.stage
                        WHERE s.trajectory_id = t.id),
           'rewards', (SELECT coalesce(json_agg(json_build_object(
                          'judge_model', w.judge_model, 'recipe', w.recipe, 'reward', w.reward,
                          'rubric', w.rubric, 'citation', w.citation, 'format', w.format,
                          'search', w.search, 'advantage', w.advantage)), '[]')
                        FROM trajectory_rewards w WHERE w.trajectory_id = t.id),
           'group', (SELECT coalesce(json_agg(json_build_object(
                          'id', o.id, 'sample_index', o.sample_index,
                          'finish_reason', o.finish_reason,
                          'reward', (SELECT w.reward FROM trajectory_rewards w
                                     WHERE w.trajectory_id = o.id
                                     ORDER BY w.created_at DESC LIMIT 1),
                          'stages', (SELECT coalesce(json_agg(json_build_object(
                                       'stage', sg.name, 'score', s.score,
                                       'advantage', s.advantage) ORDER BY s.stage), '[]')
                                     FROM stage_scores s JOIN stages sg ON sg.id = s.stage
                                     WHERE s.trajectory_id = o.id))
                          ORDER BY o.sample_index), '[]')
                        FROM trajectories o
                        WHERE o.run_id = t.run_id AND o.step = t.step AND o.task_id = t.task_id)
         )::text
         FROM trajectories t JOIN runs r ON r.id = t.run_id JOIN tasks k ON k.id = t.task_id
         WHERE t.id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?)
}

/// Tasks of a run that have rubric buffers, with counts per state.
pub async fn buffer_tasks(pool: &PgPool, run_id: Uuid) -> Result<String, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(json_agg(x ORDER BY x.rubrics DESC, x.external_id), '[]')::text FROM (
           SELECT b.task_id, k.external_id, left(k.prompt, 200) AS prompt,
                  count(*) AS rubrics,
                  count(*) FILTER (WHERE b.state = 'active') AS active,
                  count(*) FILTER (WHERE b.state = 'inactive') AS inactive,
                  count(*) FILTER (WHERE b.state = 'persistent') AS persistent,
                  max(b.updated_step) AS updated_step
           FROM rubric_buffers b JOIN tasks k ON k.id = b.task_id
           WHERE b.run_id = $1 GROUP BY b.task_id, k.external_id, k.prompt
         ) x",
    )
    .bind(run_id)
    .fetch_one(pool)
    .await?)
}

/// The rubric buffer of one task over a run's steps: each rubric with its text, origin, the
/// step it was added, its state now (inactive = pruned at `updated_step`), its stored
/// variance, and per step the number of judgments and their mean score.
pub async fn buffer(pool: &PgPool, run_id: Uuid, task_id: Uuid) -> Result<String, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT json_build_object(
           'task', (SELECT json_build_object('id', k.id, 'external_id', k.external_id,
                      'prompt', k.prompt) FROM tasks k WHERE k.id = $2),
           'rubrics', (SELECT coalesce(json_agg(json_build_object(
                         'id', u.id, 'stage', sg.name, 'origin', u.origin, 'title', u.title,
                         'description', u.description, 'weight', u.weight,
                         'negative', u.negative, 'created_step', u.created_step,
                         'state', b.state, 'variance', b.variance,
                         'updated_step', b.updated_step,
                         'scores', (SELECT coalesce(json_agg(json_build_array(p.step, p.n, p.mean)
                                      ORDER BY p.step), '[]') FROM (
                                      SELECT t.step, count(*) AS n, avg(j.score) AS mean
                                      FROM judgments j JOIN trajectories t ON t.id = j.trajectory_id
                                      WHERE j.rubric_id = u.id AND t.run_id = $1
                                      GROUP BY t.step) p))
                         ORDER BY b.stage, u.created_step NULLS FIRST, u.title), '[]')
                       FROM rubric_buffers b JOIN rubrics u ON u.id = b.rubric_id
                       JOIN stages sg ON sg.id = b.stage
                       WHERE b.run_id = $1 AND b.task_id = $2)
         )::text",
    )
    .bind(run_id)
    .bind(task_id)
    .fetch_one(pool)
    .await?)
}

/// Reflection candidates of a run (newest steps first, at most `limit`) with their judged
/// utility, validity, GRPO advantage and whether they were trained on.
pub async fn reflections(pool: &PgPool, run_id: Uuid, limit: i64) -> Result<String, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(json_agg(x ORDER BY x.step DESC, x.external_id, x.candidate_index), '[]')::text
         FROM (
           SELECT f.id, f.step, f.task_id, k.external_id, f.candidate_index, f.valid, f.score,
                  f.advantage, f.utility, f.judge_model, f.trained_step, f.policy_version,
                  f.source_trajectory_id, f.text
           FROM reflections f JOIN tasks k ON k.id = f.task_id
           WHERE f.run_id = $1
           ORDER BY f.step DESC, k.external_id, f.candidate_index LIMIT $2
         ) x",
    )
    .bind(run_id)
    .bind(limit)
    .fetch_one(pool)
    .await?)
}

/// The rubric bank of a run, optionally filtered by a case-insensitive substring of the
/// question, rubrics or takeaways (bound as a parameter, `%`/`_` taken literally).
pub async fn bank(pool: &PgPool, run_id: Uuid, query: &str, limit: i64) -> Result<String, DbError> {
    let pattern = format!(
        "%{}%",
        query
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    );
    Ok(sqlx::query_scalar(
        "SELECT coalesce(json_agg(x ORDER BY x.step DESC, x.question), '[]')::text FROM (
           SELECT b.task_id, b.question, b.rubrics, b.takeaways, b.score, b.step,
                  b.reflection_id, b.updated_at
           FROM rubric_bank b
           WHERE b.run_id = $1
             AND ($2 = '%%' OR b.question ILIKE $2 OR b.rubrics ILIKE $2 OR b.takeaways ILIKE $2)
           ORDER BY b.step DESC, b.question LIMIT $3
         ) x",
    )
    .bind(run_id)
    .bind(&pattern)
    .bind(limit)
    .fetch_one(pool)
    .await?)
}
