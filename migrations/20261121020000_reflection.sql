-- Reflection meta-policy and rubric bank (method.md A.6-A.7): per-candidate judge dimensions and
-- GRPO advantage, background job bookkeeping (lag, failures), bank rubrics as plain text, and the
-- judge call kind for reflection judging.

ALTER TABLE reflections
    ADD COLUMN advantage real,
    ADD COLUMN judge_kind text CHECK (judge_kind IN ('llm', 'lexical')),
    ADD COLUMN policy_version integer NOT NULL DEFAULT 0;
CREATE INDEX reflections_trained_idx ON reflections (run_id, trained_step);

ALTER TABLE rubric_bank ALTER COLUMN rubrics TYPE text USING rubrics #>> '{}';

-- One background reflection job per (run, step of the new-query phase).
CREATE TABLE reflection_jobs (
    run_id      uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step        integer NOT NULL,
    status      text NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    candidates  integer NOT NULL DEFAULT 0,
    valid       integer NOT NULL DEFAULT 0,
    bank_writes integer NOT NULL DEFAULT 0,
    error       text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    PRIMARY KEY (run_id, step)
);

ALTER TABLE judge_calls DROP CONSTRAINT judge_calls_kind_check;
ALTER TABLE judge_calls ADD CONSTRAINT judge_calls_kind_check
    CHECK (kind IN ('generate', 'score', 'score_fallback', 'claims', 'ground', 'reflect'));
