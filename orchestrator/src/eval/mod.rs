//! Evaluation metrics with their benchmarks' own protocols. Today: retrieval (nDCG@k over BEIR
//! qrels) for the local search index.

pub mod retrieval;
