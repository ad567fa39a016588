//! Layer 1, the domain: pure types and logic. Nothing here talks to Postgres, an inference
//! server, a tool back-end or the file system's prompts; it imports no other layer of the crate.

pub mod bank;
pub mod bench;
pub mod config;
pub mod credit;
pub mod data;
pub mod deeprubric;
pub mod eval;
pub mod export;
pub mod jsonl;
pub mod judge;
pub mod reflection;
pub mod rollout;
pub mod rubrics;
pub mod scaffold;
pub mod schedule;
pub mod tool;
pub mod tracking;
pub mod trajectory;
pub mod util;
