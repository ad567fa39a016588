//! Task sources: the generated research world (offline), and (as they land) task files in our
//! JSONL format or DR Tulu's RL rows.

pub mod demos;
pub mod tasks;
pub mod world;

use serde::{Deserialize, Serialize};

/// One corpus row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CorpusDoc {
    #[serde(alias = "_id")]
    pub id: String,
    #[serde(default)]
    pub title: String,
    #[serde(default, alias = "contents", alias = "body")]
    pub text: String,
    #[serde(default)]
    pub url: Option<String>,
}
