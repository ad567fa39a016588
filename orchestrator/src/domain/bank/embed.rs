//! Question embeddings for the bank: a configured OpenAI-compatible `/v1/embeddings` endpoint
//! (e.g. Qwen3-Embedding-0.6B behind vLLM or TEI), or, offline, a deterministic local embedding
//! (signed feature hashing of word unigrams and bigrams, `local-hash-v1`). Always L2-normalised,
//! so inner product is cosine.

/// Dimension of the local embedding.
pub const LOCAL_DIM: usize = 256;
/// The model name that selects the local embedding.
pub const LOCAL_MODEL: &str = "local-hash-v1";

/// Deterministic offline text embedding: every lower-cased alphanumeric word and every pair of
/// adjacent words is hashed (FNV-1a 64) to a signed coordinate; sublinear counts; normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalEmbedder {
    pub dim: usize,
}

impl Default for LocalEmbedder {
    fn default() -> Self {
        Self { dim: LOCAL_DIM }
    }
}

fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h ^= 0x1f;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        for b in p.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

impl LocalEmbedder {
    pub fn embed_one(&self, text: &str) -> Vec<f32> {
        let dim = self.dim.max(1);
        let words: Vec<String> = text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect();
        let mut counts = vec![0.0f32; dim];
        let mut add = |h: u64, w: f32| {
            let i = (h % dim as u64) as usize;
            counts[i] += if h >> 63 == 1 { -w } else { w };
        };
        for w in &words {
            add(fnv1a(&[w]), 1.0);
        }
        for p in words.windows(2) {
            add(fnv1a(&[&p[0], &p[1]]), 0.5);
        }
        let mut v: Vec<f32> = counts
            .into_iter()
            .map(|c| c.signum() * (1.0 + c.abs()).ln())
            .collect();
        normalize(&mut v);
        v
    }
}

/// Scale to unit L2 norm (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 && n.is_finite() {
        for x in v.iter_mut() {
            *x /= n;
        }
    }
}

/// Inner product, in eight independent accumulators (lets the compiler vectorise).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_embedding_is_deterministic_normalised_and_topical() {
        let e = LocalEmbedder::default();
        let a = e.embed_one("Which enzyme regulates glucose uptake in liver cells?");
        let b = e.embed_one("What enzyme controls glucose uptake by liver cells?");
        let c = e.embed_one("Who won the 1998 football world cup final?");
        assert_eq!(
            a,
            e.embed_one("Which enzyme regulates glucose uptake in liver cells?")
        );
        assert_eq!(a.len(), LOCAL_DIM);
        assert!((dot(&a, &a) - 1.0).abs() < 1e-5);
        assert!(
            dot(&a, &b) > dot(&a, &c) + 0.2,
            "{} vs {}",
            dot(&a, &b),
            dot(&a, &c)
        );
    }

    #[test]
    fn dot_matches_naive() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.1).collect();
        let b: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.02).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-3);
    }
}
