//! Small helpers with no better home: hashing, hex encoding, error chains, CJK character
//! classes and bigrams.

use sha2::{Digest, Sha256};

/// SHA-256 digest.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// SHA-256 as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(64);
    for b in sha256(bytes) {
        s.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        s.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
    }
    s
}

/// An error and all its sources as one line (`outer: inner: root`). A source whose message the
/// line already contains is skipped (sqlx and others repeat their source in their own message).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// The URL with its password replaced by `***`, for messages and snapshots.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        // Not a URL we can parse: redact anything between ':' and '@' in the authority.
        Err(_) => match (raw.find("://"), raw.rfind('@')) {
            (Some(s), Some(at)) if at > s => {
                let auth = &raw[s + 3..at];
                match auth.find(':') {
                    Some(c) => format!("{}{}:***{}", &raw[..s + 3], &auth[..c], &raw[at..]),
                    None => raw.to_string(),
                }
            }
            _ => raw.to_string(),
        },
    }
}

/// A splitmix64 step over `a ^ b`: derives per-trajectory and per-turn sampling seeds.
pub fn mix_seed(a: u64, b: u64) -> u64 {
    let mut z = (a ^ b.rotate_left(29)).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A task as seed material: the first 8 bytes of the SHA-256 of its identity in the task file,
/// `source` and `external_id` (the `tasks` table's unique key). Not its database id, which is a
/// fresh v7 uuid in every database: seeds drawn from the id gave the same task other samples at
/// T = 0.7 in every new database (BENCHMARKS.md, issue 25 session 68). Not its prompt either:
/// a world may ask one question as several tasks (the research world's 16 held-out tasks hold
/// 11 distinct questions), and keyed on the prompt those tasks drew identical samples, one draw
/// counted several times (session 69).
pub fn task_key(source: &str, external_id: &str) -> u64 {
    // NUL cannot occur in a Postgres text value, so two distinct pairs hash distinct strings.
    let d = sha256(format!("{source}\0{external_id}").as_bytes());
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

#[cfg(test)]
mod cjk_tests {
    use super::*;

    #[test]
    fn cjk_classes_and_bigrams() {
        assert!(is_cjk('中') && is_cjk('カ') && is_cjk('한') && !is_cjk('a') && !is_cjk('é'));
        assert_eq!(cjk_bigrams("人口政策"), vec!["人口", "口政", "政策"]);
        assert_eq!(cjk_bigrams("水"), vec!["水"]);
        assert!(cjk_bigrams("").is_empty());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_known_vector() {
        assert_eq!(
            super::sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

/// A Han, Kana or Hangul character: scripts written without spaces between words.
pub fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF      // Hiragana, Katakana
        | 0x3400..=0x4DBF    // CJK Extension A
        | 0x4E00..=0x9FFF    // CJK Unified Ideographs
        | 0xAC00..=0xD7AF    // Hangul syllables
        | 0xF900..=0xFAFF    // CJK Compatibility Ideographs
        | 0x20000..=0x2FA1F) // Extensions B-F, compatibility supplement
}

/// Overlapping character bigrams of a CJK run (a lone character stays a unigram): the indexing
/// unit of Lucene's CJKAnalyzer, so text written without spaces matches in any word order.
pub fn cjk_bigrams(run: &str) -> Vec<String> {
    let chars: Vec<char> = run.chars().collect();
    match chars.len() {
        0 => vec![],
        1 => vec![chars[0].to_string()],
        _ => chars.windows(2).map(|w| w.iter().collect()).collect(),
    }
}
