-- DeepRubric data construction (`orchestrator data deeprubric`, issue 21): a build (one name,
-- its settings and final statistics), one evidence tree per seed with its nodes (written as each
-- node is processed: a killed build continues at the first pending node, never duplicating
-- one), one composed query-rubric candidate per tree (or the reason it failed), and one
-- verification per candidate (KEEP / REVISE / DROP with error tags, the final pair, or the
-- reason it failed). LLM calls and tokens are kept per stage on the rows that spent them.

CREATE TABLE dr_builds (
    id          uuid PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    config      jsonb NOT NULL,
    status      text NOT NULL DEFAULT 'running'
                CHECK (status IN ('running', 'finished', 'interrupted', 'failed')),
    stats       jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE dr_trees (
    build_id          uuid NOT NULL REFERENCES dr_builds (id) ON DELETE CASCADE,
    seed_index        integer NOT NULL,
    seed              text NOT NULL,
    status            text NOT NULL DEFAULT 'growing'
                      CHECK (status IN ('growing', 'grown', 'failed')),
    stop_reason       text,
    error             text,
    llm_calls         integer NOT NULL DEFAULT 0,
    prompt_tokens     bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    seconds           double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (build_id, seed_index)
);

CREATE TABLE dr_nodes (
    build_id     uuid NOT NULL,
    seed_index   integer NOT NULL,
    -- N1 (the root), N2, ... in creation order
    node_id      text NOT NULL,
    ordinal      integer NOT NULL,
    parent       text,
    depth        smallint NOT NULL,
    query        text NOT NULL,
    statements   jsonb NOT NULL DEFAULT '[]',
    -- [{id, title, url}] of the passages the statements came from
    passages     jsonb NOT NULL DEFAULT '[]',
    status       text NOT NULL CHECK (status IN ('pending', 'expanded', 'leaf', 'failed')),
    stop_reason  text,
    PRIMARY KEY (build_id, seed_index, node_id),
    UNIQUE (build_id, seed_index, ordinal),
    FOREIGN KEY (build_id, seed_index) REFERENCES dr_trees (build_id, seed_index) ON DELETE CASCADE
);

CREATE TABLE dr_items (
    build_id          uuid NOT NULL,
    seed_index        integer NOT NULL,
    status            text NOT NULL CHECK (status IN ('composed', 'failed')),
    -- {question, selected_leaf_ids, selection_trace, merge_trace, rubrics}
    candidate         jsonb,
    error             text,
    raw               text,
    attempts          integer NOT NULL DEFAULT 0,
    llm_calls         integer NOT NULL DEFAULT 0,
    prompt_tokens     bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (build_id, seed_index),
    FOREIGN KEY (build_id, seed_index) REFERENCES dr_trees (build_id, seed_index) ON DELETE CASCADE
);

CREATE TABLE dr_verdicts (
    build_id          uuid NOT NULL,
    seed_index        integer NOT NULL,
    decision          text CHECK (decision IN ('KEEP', 'REVISE', 'DROP')),
    error_tags        jsonb NOT NULL DEFAULT '[]',
    -- the whole verification as returned
    verdict           jsonb,
    -- {question, rubrics, removed} of a kept or revised pair
    final             jsonb,
    error             text,
    raw               text,
    attempts          integer NOT NULL DEFAULT 0,
    llm_calls         integer NOT NULL DEFAULT 0,
    prompt_tokens     bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (build_id, seed_index),
    FOREIGN KEY (build_id, seed_index) REFERENCES dr_items (build_id, seed_index) ON DELETE CASCADE
);
