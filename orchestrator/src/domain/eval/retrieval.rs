//! Retrieval quality: nDCG@k with graded relevance (BEIR / pytrec_eval definition: gain = rel,
//! discount = log2(rank + 1), ideal ranking from the qrels), averaged over queries that have
//! judgments.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

/// query id -> (doc id -> relevance)
pub type Qrels = HashMap<String, HashMap<String, u32>>;

/// nDCG@k of one ranking against one query's judgments; 0 when nothing is relevant.
pub fn ndcg_at_k(ranked: &[String], rel: &HashMap<String, u32>, k: usize) -> f64 {
    let dcg: f64 = ranked
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, d)| f64::from(*rel.get(d).unwrap_or(&0)) / ((i + 2) as f64).log2())
        .sum();
    let mut ideal: Vec<u32> = rel.values().copied().filter(|r| *r > 0).collect();
    ideal.sort_unstable_by(|a, b| b.cmp(a));
    let idcg: f64 = ideal
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, r)| f64::from(*r) / ((i + 2) as f64).log2())
        .sum();
    if idcg == 0.0 { 0.0 } else { dcg / idcg }
}

/// Read a BEIR qrels TSV (`query-id<TAB>corpus-id<TAB>score`, header optional).
pub fn read_qrels(path: &Path) -> std::io::Result<Qrels> {
    let mut q: Qrels = HashMap::new();
    for line in std::io::BufReader::new(std::fs::File::open(path)?).lines() {
        let line = line?;
        let mut parts = line.split('\t');
        let (Some(qid), Some(did), Some(score)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Ok(score) = score.trim().parse::<u32>() else {
            continue;
        }; // header row
        q.entry(qid.to_string())
            .or_default()
            .insert(did.to_string(), score);
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(pairs: &[(&str, u32)]) -> HashMap<String, u32> {
        pairs.iter().map(|(d, r)| (d.to_string(), *r)).collect()
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn perfect_and_empty() {
        let r = rel(&[("a", 1), ("b", 1)]);
        assert!((ndcg_at_k(&ids(&["a", "b", "c"]), &r, 10) - 1.0).abs() < 1e-12);
        assert_eq!(ndcg_at_k(&ids(&["x", "y"]), &r, 10), 0.0);
        assert_eq!(ndcg_at_k(&ids(&["a"]), &rel(&[]), 10), 0.0);
    }

    #[test]
    fn known_value() {
        // One relevant doc at rank 2: DCG = 1/log2(3), IDCG = 1.
        let v = ndcg_at_k(&ids(&["x", "a"]), &rel(&[("a", 1)]), 10);
        assert!((v - 1.0 / 3f64.log2()).abs() < 1e-12);
        // Beyond k it does not count.
        assert_eq!(ndcg_at_k(&ids(&["x", "a"]), &rel(&[("a", 1)]), 1), 0.0);
        // Graded: rel 2 at rank 1, rel 1 at rank 2 vs ideal same order = 1.
        let r = rel(&[("a", 1), ("b", 2)]);
        let v = ndcg_at_k(&ids(&["a", "b"]), &r, 10);
        let dcg = 1.0 + 2.0 / 3f64.log2();
        let idcg = 2.0 + 1.0 / 3f64.log2();
        assert!((v - dcg / idcg).abs() < 1e-12);
    }
}
