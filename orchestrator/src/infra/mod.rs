//! Layer 2, the doors: one module per external dependency (Postgres in `db`, inference servers
//! and the trainer's HTTP API in `llm`, tokenizers and chat templates in `chat`, tool back-ends
//! in `tools`, experiment trackers in `tracking`). Doors import domain types only, and each
//! other where one door is built on another (the LLM judge speaks through `llm`, the MLflow
//! client through `llm`'s HTTP builder and retry policy).

pub mod chat;
pub mod db;
pub mod embed;
pub mod llm;
pub mod prompts;
pub mod tools;
pub mod tracking;
