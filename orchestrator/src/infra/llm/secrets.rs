//! API keys never leave the process in text: every key read from the environment (inference
//! servers, the judge, web-search tools) is registered here, and error text built from what a
//! server answered goes through [`redact`] before it is logged or stored, so a server that
//! echoes the `Authorization` header in an error body cannot put the key into stderr or
//! Postgres.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock, RwLock};

/// What a registered key becomes in text.
pub const REDACTED: &str = "[redacted]";

/// Keys shorter than this are not registered (they would redact ordinary words); real API keys
/// are far longer.
const MIN_SECRET_LEN: usize = 8;

fn registry() -> &'static RwLock<Vec<Arc<str>>> {
    static SECRETS: OnceLock<RwLock<Vec<Arc<str>>>> = OnceLock::new();
    SECRETS.get_or_init(|| RwLock::new(Vec::new()))
}

/// Remember a key so that [`redact`] removes it from any text.
pub fn register(secret: &str) {
    let secret = secret.trim();
    if secret.len() < MIN_SECRET_LEN {
        return;
    }
    let mut g = match registry().write() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if !g.iter().any(|s| &**s == secret) {
        g.push(Arc::from(secret));
    }
}

/// The value of environment variable `var` (trimmed, non-empty), registered as a secret.
pub fn env_key(var: &str) -> Option<String> {
    let v = std::env::var(var).ok()?;
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    register(v);
    Some(v.to_string())
}

/// `text` with every registered key replaced by [`REDACTED`].
pub fn redact(text: &str) -> Cow<'_, str> {
    let g = match registry().read() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    let mut out = Cow::Borrowed(text);
    for s in g.iter() {
        if out.contains(&**s) {
            out = Cow::Owned(out.replace(&**s, REDACTED));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_keys_are_redacted_and_short_ones_ignored() {
        register("sk-test-0123456789abcdef");
        register("abc");
        assert_eq!(
            redact("Bearer sk-test-0123456789abcdef and sk-test-0123456789abcdef"),
            "Bearer [redacted] and [redacted]"
        );
        assert_eq!(redact("abc stays"), "abc stays");
        assert!(matches!(redact("nothing here"), Cow::Borrowed(_)));
    }
}
