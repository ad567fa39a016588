//! The rubric bank (method.md A.6.4-A.6.5): one item per task with the best valid reflection,
//! persisted in Postgres (`rubric_bank`) and mirrored in an in-memory flat inner-product index
//! over L2-normalised question embeddings; within-episode lookup by the question's SHA-256,
//! cross-episode top-k by cosine over other tasks; and the `<reference_examples>` block that
//! injects retrieved items before the user question (prompt tokens, no loss). The run's bank
//! over Postgres and the embedder is `pipeline::bank::Bank`; rendering is `infra::prompts`.

pub mod embed;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

pub use embed::{LocalEmbedder, dot, normalize};

#[derive(Debug, thiserror::Error)]
pub enum BankError {
    /// A Postgres error (`infra::db::DbError`, converted there).
    #[error(transparent)]
    Db(std::sync::Arc<dyn std::error::Error + Send + Sync>),
    /// An embedding-endpoint error (`infra::llm::LlmError`, converted there).
    #[error("embedding endpoint failed: {0}")]
    Embed(std::sync::Arc<dyn std::error::Error + Send + Sync>),
    #[error("embedding of dimension {got} does not match the bank's {want} (model changed?)")]
    Dimension { got: usize, want: usize },
    #[error("cannot render `{name}`: {message}")]
    Prompt { name: &'static str, message: String },
    #[error(
        "embeddings.model = {model:?} needs embeddings.urls (an OpenAI-compatible /v1/embeddings \
         endpoint serving it); set embeddings.model = \"local-hash-v1\" to choose the local \
         feature-hash embedding instead"
    )]
    NoEndpoint { model: String },
}

/// SHA-256 of the question text, lower-case hex (the within-episode key).
pub fn question_hash(question: &str) -> String {
    let d = Sha256::digest(question.as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// One bank item (a row of `rubric_bank`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BankItem {
    pub task_id: Uuid,
    pub question: String,
    pub question_sha256: String,
    /// L2-normalised question embedding.
    pub embedding: Vec<f32>,
    /// The `<reflection_rubrics>` block's text.
    pub rubrics: String,
    /// The `<reflection_takeaways>` block's text.
    pub takeaways: String,
    /// The reflection's judged utility.
    pub score: f32,
    /// The step whose reflection wrote it.
    pub step: i32,
    pub reflection_id: Option<Uuid>,
}

/// Which memory a prompt may draw on (training curriculum phase or evaluation switch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Reuse {
    /// No injection.
    None,
    /// The item of this very question (exact hash), else cross-episode.
    Within,
    /// Top-k items of other questions.
    Cross,
}

impl Reuse {
    pub fn as_str(self) -> &'static str {
        match self {
            Reuse::None => "none",
            Reuse::Within => "within",
            Reuse::Cross => "cross",
        }
    }
}

/// What a lookup found.
#[derive(Debug, Clone, PartialEq)]
pub enum Retrieved {
    Nothing,
    /// This question's own item.
    Within(BankItem),
    /// Items of similar questions, most similar first, with their cosine.
    Cross(Vec<(BankItem, f32)>),
}

impl Retrieved {
    /// Each item's rubrics and takeaways cut to at most `max_chars` characters together
    /// (`reflection.max_item_chars`; 0 keeps them whole): whole lines only, rubrics first, then
    /// takeaways, each in order, a line that does not fit skipped for the shorter ones after it,
    /// so the block never carries a half line. The question of a cross item stays whole.
    pub fn clipped(self, max_chars: usize) -> Self {
        if max_chars == 0 {
            return self;
        }
        let clip = |mut it: BankItem| {
            let mut left = max_chars;
            it.rubrics = keep_lines(&it.rubrics, &mut left);
            it.takeaways = keep_lines(&it.takeaways, &mut left);
            it
        };
        match self {
            Retrieved::Nothing => Retrieved::Nothing,
            Retrieved::Within(it) => Retrieved::Within(clip(it)),
            Retrieved::Cross(v) => {
                Retrieved::Cross(v.into_iter().map(|(it, c)| (clip(it), c)).collect())
            }
        }
    }

    /// The mode that was served (`within` may fall back to `cross`).
    pub fn mode(&self) -> Reuse {
        match self {
            Retrieved::Nothing => Reuse::None,
            Retrieved::Within(_) => Reuse::Within,
            Retrieved::Cross(v) if v.is_empty() => Reuse::None,
            Retrieved::Cross(_) => Reuse::Cross,
        }
    }
}

/// The lines of `text` (trimmed, blank ones dropped) that fit in `left` characters, in order;
/// each kept line's characters are taken from `left`.
fn keep_lines(text: &str, left: &mut usize) -> String {
    let mut kept = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let n = line.chars().count();
        if n <= *left {
            *left -= n;
            kept.push(line);
        }
    }
    kept.join("\n")
}

/// The in-memory index: items with their embeddings as one row-major matrix (flat scan; at
/// 100k x 1024 a top-2 query is one pass over 400 MB of f32, see BENCHMARKS.md).
#[derive(Debug, Default, Clone)]
pub struct BankIndex {
    items: Vec<BankItem>,
    matrix: Vec<f32>,
    dim: usize,
    by_task: HashMap<Uuid, usize>,
    by_hash: HashMap<String, usize>,
}

impl BankIndex {
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn items(&self) -> &[BankItem] {
        &self.items
    }

    /// Insert, or overwrite the task's item (the bank tracks the evolving policy).
    pub fn upsert(&mut self, mut item: BankItem) -> Result<(), BankError> {
        embed::normalize(&mut item.embedding);
        if self.items.is_empty() && self.dim == 0 {
            self.dim = item.embedding.len();
        }
        if item.embedding.len() != self.dim {
            return Err(BankError::Dimension {
                got: item.embedding.len(),
                want: self.dim,
            });
        }
        match self.by_task.get(&item.task_id).copied() {
            Some(i) => {
                let old = std::mem::replace(&mut self.items[i], item);
                if self.by_hash.get(&old.question_sha256) == Some(&i) {
                    self.by_hash.remove(&old.question_sha256);
                }
                let it = &self.items[i];
                self.matrix[i * self.dim..(i + 1) * self.dim].copy_from_slice(&it.embedding);
                self.by_hash.insert(it.question_sha256.clone(), i);
            }
            None => {
                let i = self.items.len();
                self.matrix.extend_from_slice(&item.embedding);
                self.by_task.insert(item.task_id, i);
                self.by_hash.insert(item.question_sha256.clone(), i);
                self.items.push(item);
            }
        }
        Ok(())
    }

    /// Exact match on the question's SHA-256.
    pub fn within(&self, hash: &str) -> Option<&BankItem> {
        self.by_hash.get(hash).map(|&i| &self.items[i])
    }

    /// The `k` most similar items by cosine, excluding `task` and any item with the same
    /// question hash (the same question under another id). Ties break by insertion order.
    pub fn top_k(
        &self,
        query: &[f32],
        k: usize,
        task: Uuid,
        hash: &str,
    ) -> Result<Vec<(&BankItem, f32)>, BankError> {
        if self.items.is_empty() || k == 0 {
            return Ok(vec![]);
        }
        if query.len() != self.dim {
            return Err(BankError::Dimension {
                got: query.len(),
                want: self.dim,
            });
        }
        let mut q = query.to_vec();
        embed::normalize(&mut q);
        // Best k so far, sorted by descending score.
        let mut best: Vec<(f32, usize)> = Vec::with_capacity(k + 1);
        for (i, row) in self.matrix.chunks_exact(self.dim).enumerate() {
            let s = embed::dot(row, &q);
            if best.len() == k && s <= best[k - 1].0 {
                continue;
            }
            let it = &self.items[i];
            if it.task_id == task || it.question_sha256 == hash {
                continue;
            }
            let at = best.partition_point(|&(b, _)| b >= s);
            best.insert(at, (s, i));
            best.truncate(k);
        }
        Ok(best.into_iter().map(|(s, i)| (&self.items[i], s)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(task: u128, q: &str, emb: Vec<f32>) -> BankItem {
        BankItem {
            task_id: Uuid::from_u128(task),
            question: q.into(),
            question_sha256: question_hash(q),
            embedding: emb,
            rubrics: format!("rubrics of {q}"),
            takeaways: format!("takeaways of {q}"),
            score: 0.5,
            step: 0,
            reflection_id: None,
        }
    }

    #[test]
    fn hash_is_sha256_hex() {
        assert_eq!(
            question_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn top_k_by_cosine_excludes_the_task_and_its_hash() {
        let mut ix = BankIndex::default();
        ix.upsert(item(1, "q1", vec![1.0, 0.0, 0.0])).unwrap();
        ix.upsert(item(2, "q2", vec![0.9, 0.1, 0.0])).unwrap();
        ix.upsert(item(3, "q3", vec![0.0, 1.0, 0.0])).unwrap();
        ix.upsert(item(4, "q4", vec![0.5, 0.5, 0.0])).unwrap();
        // The query is q1 itself: q1 is excluded, the two nearest others come back in order.
        let got = ix
            .top_k(
                &[1.0, 0.0, 0.0],
                2,
                Uuid::from_u128(1),
                &question_hash("q1"),
            )
            .unwrap();
        let ids: Vec<u128> = got.iter().map(|(i, _)| i.task_id.as_u128()).collect();
        assert_eq!(ids, vec![2, 4]);
        assert!(got[0].1 > got[1].1);
        // The same question text under another task id is excluded by hash.
        let got = ix
            .top_k(
                &[0.9, 0.1, 0.0],
                2,
                Uuid::from_u128(99),
                &question_hash("q2"),
            )
            .unwrap();
        let ids: Vec<u128> = got.iter().map(|(i, _)| i.task_id.as_u128()).collect();
        assert_eq!(ids, vec![1, 4]);
        // Dimension mismatch is an error naming both.
        let e = ix.top_k(&[1.0], 2, Uuid::nil(), "").unwrap_err();
        assert!(e.to_string().contains("dimension 1"), "{e}");
    }

    #[test]
    fn upsert_overwrites_the_tasks_item() {
        let mut ix = BankIndex::default();
        ix.upsert(item(1, "q1", vec![1.0, 0.0])).unwrap();
        ix.upsert(item(2, "q2", vec![0.0, 1.0])).unwrap();
        let mut newer = item(1, "q1", vec![0.0, 1.0]);
        newer.rubrics = "newer".into();
        ix.upsert(newer).unwrap();
        assert_eq!(ix.len(), 2);
        assert_eq!(ix.within(&question_hash("q1")).unwrap().rubrics, "newer");
        // The overwritten embedding is the one searched.
        let got = ix.top_k(&[0.0, 1.0], 1, Uuid::from_u128(2), "").unwrap();
        assert_eq!(got[0].0.task_id, Uuid::from_u128(1));
    }

    #[test]
    fn injection_formats() {
        let a = item(1, "What is A?", vec![1.0]);
        let b = item(2, "What is B?", vec![1.0]);
        let within = Retrieved::Within(a.clone()).inject("QUESTION").unwrap();
        assert!(within.starts_with("<reference_examples>\n"), "{within}");
        assert!(within.contains("## Your Previous Attempt at This Question\n### Rubrics:\nrubrics of What is A?\n### Takeaways:\ntakeaways of What is A?\n</reference_examples>\n\nQUESTION"), "{within}");
        let cross = Retrieved::Cross(vec![(a, 0.9), (b, 0.8)])
            .inject("QUESTION")
            .unwrap();
        assert!(
            cross
                .contains("## Similar Question 1: What is A?\n### Rubrics:\nrubrics of What is A?"),
            "{cross}"
        );
        assert!(
            cross.contains("takeaways of What is A?\n---\n## Similar Question 2: What is B?"),
            "{cross}"
        );
        assert!(
            cross.ends_with("</reference_examples>\n\nQUESTION"),
            "{cross}"
        );
        assert_eq!(cross.matches("---").count(), 1);
        assert_eq!(Retrieved::Nothing.inject("Q").unwrap(), "Q");
        assert_eq!(Retrieved::Cross(vec![]).inject("Q").unwrap(), "Q");
    }

    #[test]
    fn clipping_keeps_whole_lines_within_the_cap() {
        let mut a = item(1, "What is A?", vec![1.0]);
        a.rubrics = "Critical Requirement: name the compound A binds, and its city.\n\
                     Analytical Approach: search A.\nPitfalls: none."
            .into();
        a.takeaways = "- Cite every fact.\n- Search the name each snippet gives.".into();
        let whole = Retrieved::Within(a.clone());
        assert_eq!(whole.clone().clipped(0), whole, "0 keeps items whole");
        let Retrieved::Cross(v) = Retrieved::Cross(vec![(a.clone(), 0.5)]).clipped(64) else {
            panic!("a cross item stays cross");
        };
        let (it, cos) = &v[0];
        assert_eq!(*cos, 0.5);
        assert_eq!(it.question, "What is A?", "the question is never cut");
        // The 62-character first line fits the 64; the next lines do not, but nothing after
        // them is shorter than the 2 left.
        assert_eq!(
            it.rubrics,
            "Critical Requirement: name the compound A binds, and its city."
        );
        assert_eq!(it.takeaways, "");
        // At 60 the long first line is skipped for the shorter ones after it.
        let Retrieved::Within(it) = whole.clipped(60) else {
            panic!("a within item stays within");
        };
        assert_eq!(
            it.rubrics,
            "Analytical Approach: search A.\nPitfalls: none."
        );
        assert_eq!(
            it.takeaways, "",
            "the 18-character takeaway does not fit in the 15 left"
        );
        let chars = it.rubrics.chars().filter(|c| *c != '\n').count();
        assert!(chars <= 60, "{chars}");
    }
}
