//! Evaluation metrics with their benchmarks' own protocols: retrieval (nDCG@k over BEIR qrels)
//! for the local search index, HealthBench points rubrics, DeepResearch Bench (RACE) criteria,
//! and known-answer matching for short-answer tasks.

pub mod answer;
pub mod drbench;
pub mod healthbench;
pub mod retrieval;
