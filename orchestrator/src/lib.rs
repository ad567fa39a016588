//! RubricEM orchestrator: experiment configuration, the Postgres store, the inference-server
//! client, tokenizer/chat templates, and (as they land) rollout, judging, credit assignment,
//! reflection, the rubric bank and the asynchronous pipeline. Binaries stay thin; all logic is
//! reachable from here.
#![forbid(unsafe_code)]

pub mod app;
pub mod bank;
pub mod chat;
pub mod cli;
pub mod config;
pub mod credit;
pub mod data;
pub mod db;
pub mod eval;
pub mod judge;
pub mod llm;
pub mod pipeline;
pub mod reflection;
pub mod report;
pub mod rollout;
pub mod rubrics;
pub mod scaffold;
pub mod sft;
pub mod telemetry;
pub mod tools;
pub mod trajectory;
pub mod util;
