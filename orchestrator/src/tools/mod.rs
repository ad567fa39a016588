//! Tools the policy calls between turns: the Tool trait and runner (limits, timeouts, cache,
//! output formatting), web and paper search, local BM25 search, and browsing behind the SSRF
//! guard. An MCP client is still to come.

pub mod browse;
pub mod local_search;
pub mod runner;
pub mod search_apis;
pub mod ssrf;

pub use local_search::{CorpusDoc, Hit, IndexError, LocalIndex, read_corpus};
