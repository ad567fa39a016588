//! RubricEM orchestrator, in three layers (ARCHITECTURE.md):
//!
//! 1. [`domain`]: pure types and logic (trajectory, scaffold, rubrics, judge scoring, credit,
//!    reflection maths, bank items, curriculum, configuration). Imports no other layer.
//! 2. [`infra`]: the doors to the outside world (Postgres, inference servers, prompts and chat
//!    templates, tools, embeddings). Imports domain types only.
//! 3. [`pipeline`] (stages: rollout, judging, reflection jobs, evaluation, training sync, the run
//!    lifecycle) and [`commands`] (one file per subcommand): the only code that combines the two.
//!
//! `tests/layers.rs` fails the build's tests when an import runs upward or forms a circle.
#![forbid(unsafe_code)]

pub mod cli;
pub mod commands;
pub mod domain;
pub mod infra;
pub mod pipeline;
pub mod telemetry;
