//! Tools the policy calls between turns: the Tool trait and runner (limits, timeouts, cache,
//! output formatting), web and paper search, local BM25 search, and browsing behind the SSRF
//! guard, and tools served by MCP servers.

pub mod browse;
pub mod local_search;
pub mod mcp;
pub mod runner;
pub mod search_apis;
pub mod setup;
pub mod ssrf;

pub use local_search::{CorpusDoc, Hit, IndexError, LocalIndex, read_corpus};
