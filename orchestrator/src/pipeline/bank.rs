//! A run's rubric bank as the pipeline uses it: Postgres rows (`infra::db::bank`) mirrored in the
//! in-memory index of `domain::bank`, keyed by the embedder of `infra::embed`.

use std::sync::RwLock;

use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::bank::{BankError, BankIndex, BankItem, Retrieved, Reuse, question_hash};
use crate::infra::db;
pub use crate::infra::embed::Embedder;

/// A run's bank: Postgres rows mirrored in memory, with the embedder that keys them. Writes go
/// to Postgres first (in the reflection job's transaction), then [`Bank::insert_cached`].
pub struct Bank {
    embedder: Embedder,
    index: RwLock<BankIndex>,
    pub top_k: usize,
}

impl Bank {
    /// Load the run's bank from Postgres (on resume it is exactly what was committed).
    pub async fn load(
        pool: PgPool,
        run_id: Uuid,
        embedder: Embedder,
        top_k: usize,
    ) -> Result<Self, BankError> {
        let mut index = BankIndex::default();
        for it in db::bank::load(&pool, run_id).await? {
            index.upsert(it)?;
        }
        Ok(Self {
            embedder,
            index: RwLock::new(index),
            top_k,
        })
    }

    pub fn len(&self) -> usize {
        self.index.read().map(|i| i.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Embed questions (normalised).
    pub async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, BankError> {
        self.embedder.embed(texts).await
    }

    /// Mirror an item already committed to Postgres (e.g. in a caller's transaction).
    pub fn insert_cached(&self, item: BankItem) -> Result<(), BankError> {
        match self.index.write() {
            Ok(mut g) => g.upsert(item),
            Err(p) => p.into_inner().upsert(item),
        }
    }

    /// Look up memory for one question; see [`Bank::retrieve_many`].
    pub async fn retrieve(
        &self,
        task: Uuid,
        question: &str,
        mode: Reuse,
    ) -> Result<Retrieved, BankError> {
        let mut got = self.retrieve_many(&[(task, question)], mode).await?;
        Ok(got.pop().unwrap_or(Retrieved::Nothing))
    }

    /// Look up memory for a step's questions `(task, question)`, in order. `Within` falls back
    /// to cross-episode for a question without an item (e.g. its reflection job failed). The
    /// questions that need cross-episode retrieval are embedded in one call.
    pub async fn retrieve_many(
        &self,
        queries: &[(Uuid, &str)],
        mode: Reuse,
    ) -> Result<Vec<Retrieved>, BankError> {
        if mode == Reuse::None || self.is_empty() {
            return Ok(vec![Retrieved::Nothing; queries.len()]);
        }
        let hashes: Vec<String> = queries.iter().map(|(_, q)| question_hash(q)).collect();
        let mut out: Vec<Option<Retrieved>> = hashes
            .iter()
            .map(|h| {
                if mode == Reuse::Within {
                    self.read(|ix| ix.within(h).cloned()).map(Retrieved::Within)
                } else {
                    None
                }
            })
            .collect();
        let need: Vec<usize> = (0..queries.len()).filter(|&i| out[i].is_none()).collect();
        let texts: Vec<String> = need.iter().map(|&i| queries[i].1.to_string()).collect();
        let embs = if texts.is_empty() {
            vec![]
        } else {
            self.embed(&texts).await?
        };
        for (&i, q) in need.iter().zip(&embs) {
            let found = self.read(|ix| {
                ix.top_k(q, self.top_k, queries[i].0, &hashes[i]).map(|v| {
                    v.into_iter()
                        .map(|(it, s)| (it.clone(), s))
                        .collect::<Vec<_>>()
                })
            })?;
            out[i] = Some(Retrieved::Cross(found));
        }
        Ok(out
            .into_iter()
            .map(|r| r.unwrap_or(Retrieved::Nothing))
            .collect())
    }

    fn read<T>(&self, f: impl FnOnce(&BankIndex) -> T) -> T {
        match self.index.read() {
            Ok(g) => f(&g),
            Err(p) => f(&p.into_inner()),
        }
    }
}
