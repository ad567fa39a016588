//! Layer 2, the doors: one module per external dependency (Postgres in `db`, inference servers
//! and the trainer's HTTP API in `llm`, tokenizers and chat templates in `chat`, tool back-ends
//! in `tools`). Doors import domain types only, and each other where one door is built on
//! another (the LLM judge speaks through `llm`).

pub mod chat;
pub mod db;
pub mod embed;
pub mod llm;
pub mod prompts;
pub mod tools;
