//! Bearer tokens of the project's HTTP servers (`trainer serve`, `orchestrator dashboard`),
//! kept only as their SHA-256 digest: a presented token is compared by digest in constant
//! time, and `Debug` prints no part of it. Each server names its own environment variable in
//! its errors.

use sha2::{Digest, Sha256};

/// Shortest accepted token.
pub const MIN_TOKEN_BYTES: usize = 16;
/// Longest accepted token (it travels in a header).
pub const MAX_TOKEN_BYTES: usize = 4096;

/// Why a token was refused (the caller adds which variable held it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenError {
    /// Its length in bytes is outside `MIN_TOKEN_BYTES..=MAX_TOKEN_BYTES`.
    Length { len: usize },
    /// A byte outside printable ASCII without spaces (0x21..=0x7e).
    Byte { at: usize, byte: u8 },
}

/// A token's SHA-256 digest.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenDigest([u8; 32]);

impl std::fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenDigest(***)")
    }
}

impl TokenDigest {
    /// The digest of `raw`: `MIN_TOKEN_BYTES..=MAX_TOKEN_BYTES` printable ASCII characters
    /// without spaces.
    pub fn new(raw: &str) -> Result<Self, TokenError> {
        let len = raw.len();
        if !(MIN_TOKEN_BYTES..=MAX_TOKEN_BYTES).contains(&len) {
            return Err(TokenError::Length { len });
        }
        if let Some((at, &byte)) = raw
            .as_bytes()
            .iter()
            .enumerate()
            .find(|(_, b)| !(0x21..=0x7e).contains(*b))
        {
            return Err(TokenError::Byte { at, byte });
        }
        Ok(Self(Sha256::digest(raw.as_bytes()).into()))
    }

    /// Whether `presented` is the token: digests compared in constant time.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let other: [u8; 32] = Sha256::digest(presented).into();
        let diff = self
            .0
            .iter()
            .zip(&other)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_compared_and_never_printed() {
        assert_eq!(
            TokenDigest::new("short").unwrap_err(),
            TokenError::Length { len: 5 }
        );
        assert_eq!(
            TokenDigest::new("0123456789abcdef ").unwrap_err(),
            TokenError::Byte { at: 16, byte: b' ' }
        );
        let t = TokenDigest::new("0123456789abcdef").unwrap();
        assert_eq!(format!("{t:?}"), "TokenDigest(***)");
        assert!(t.matches(b"0123456789abcdef") && !t.matches(b"0123456789abcdeF"));
    }
}
