//! Evaluation metrics with their benchmarks' own protocols: retrieval (nDCG@k over BEIR qrels)
//! for the local search index and known-answer matching for short-answer tasks. The benchmarks'
//! own protocols live in `domain::bench`.

pub mod answer;
pub mod paired;
pub mod retrieval;
