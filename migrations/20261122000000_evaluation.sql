-- Evaluation of each run's policy on fixed task subsets (method.md A.9: ablations are compared on
-- a fixed random subset per benchmark). One `evaluations` row per (run, policy version, subset),
-- written in one transaction with its per-task results, so an evaluation is either complete or
-- absent. Main evaluations inject no bank items; scores use each task's persistent rubrics only
-- (never a run's evolving buffers), so every recipe is measured by the same yardstick.

CREATE TABLE evaluations (
    run_id           uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    policy_version   integer NOT NULL CHECK (policy_version >= 0),
    subset           text NOT NULL,
    judge_model      text NOT NULL,
    tasks            integer NOT NULL,
    samples          integer NOT NULL,
    -- Mean persistent-rubric Answer score over the judged results (NULL when none was judged).
    score            double precision,
    -- Share of results whose answer contains the known short answer, over tasks that have one.
    exact            double precision,
    judged           integer NOT NULL,
    failed           integer NOT NULL,
    parse_failures   integer NOT NULL,
    model_tokens     bigint NOT NULL,
    judge_cost_usd   double precision NOT NULL DEFAULT 0,
    seconds          double precision NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, policy_version, subset)
);

CREATE TABLE evaluation_results (
    run_id           uuid NOT NULL,
    policy_version   integer NOT NULL,
    subset           text NOT NULL,
    task_id          uuid NOT NULL REFERENCES tasks (id),
    sample_index     integer NOT NULL CHECK (sample_index >= 0),
    finish_reason    text NOT NULL,
    answer           text,
    parsed           jsonb NOT NULL DEFAULT '{}'::jsonb,
    num_model_tokens integer NOT NULL DEFAULT 0,
    tool_calls       integer NOT NULL DEFAULT 0,
    parse_failed     boolean NOT NULL,
    score            double precision,
    rubric_scores    jsonb NOT NULL DEFAULT '[]'::jsonb,
    exact            boolean,
    -- Why there is no score: the rollout or the judge failed, or the task has no rubrics.
    error            text,
    PRIMARY KEY (run_id, policy_version, subset, task_id, sample_index),
    FOREIGN KEY (run_id, policy_version, subset)
        REFERENCES evaluations (run_id, policy_version, subset) ON DELETE CASCADE
);
