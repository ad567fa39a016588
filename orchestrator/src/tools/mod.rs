//! Tools the policy calls between turns. Today: `local_search` (BM25 over a local corpus). The
//! Tool trait, web search, snippet search, browsing with its SSRF guard, MCP and the Postgres
//! result cache land with the rollout engine.

pub mod browse;
pub mod local_search;
pub mod ssrf;

pub use local_search::{CorpusDoc, Hit, IndexError, LocalIndex, read_corpus};
