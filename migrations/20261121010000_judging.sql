-- Judging: how each stage score was obtained and by which kind of judge, every judge call with
-- its cost (failed ones included), and the scalar rewards of the DR Tulu recipe.

ALTER TABLE stage_scores
    ADD COLUMN source text NOT NULL DEFAULT 'judged'
        CHECK (source IN ('judged', 'broadcast', 'failed')),
    ADD COLUMN judge_kind text NOT NULL DEFAULT 'llm' CHECK (judge_kind IN ('llm', 'lexical'));

CREATE TABLE judge_calls (
    id                uuid PRIMARY KEY,
    run_id            uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step              integer NOT NULL,
    task_id           uuid REFERENCES tasks (id) ON DELETE CASCADE,
    trajectory_id     uuid REFERENCES trajectories (id) ON DELETE CASCADE,
    kind              text NOT NULL
                      CHECK (kind IN ('generate', 'score', 'score_fallback', 'claims', 'ground')),
    judge_model       text NOT NULL,
    judge_kind        text NOT NULL CHECK (judge_kind IN ('llm', 'lexical')),
    ok                boolean NOT NULL,
    attempts          integer NOT NULL,
    prompt_tokens     integer NOT NULL DEFAULT 0,
    completion_tokens integer NOT NULL DEFAULT 0,
    cost_usd          double precision NOT NULL DEFAULT 0,
    latency_ms        integer NOT NULL DEFAULT 0,
    error             text,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX judge_calls_run_step_idx ON judge_calls (run_id, step);

-- One scalar reward per trajectory and judge (Baseline-RL: R4; DR Tulu: the composite), with
-- the parts it was made of and the GRPO advantage it produced.
CREATE TABLE trajectory_rewards (
    trajectory_id uuid NOT NULL REFERENCES trajectories (id) ON DELETE CASCADE,
    judge_model   text NOT NULL,
    recipe        text NOT NULL,
    reward        real NOT NULL,
    rubric        real NOT NULL,
    citation      real,
    format        real,
    search        real,
    advantage     real NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (trajectory_id, judge_model)
);
