//! `PolicyVersion`: the number of train steps a policy has taken (0 is the loaded model), one
//! type for both sides of the trainer link. On the wire it is a bare JSON integer.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A policy version: incremented by every train step, 0 for the model as loaded.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct PolicyVersion(pub i64);

impl PolicyVersion {
    /// The loaded model, before any train step.
    pub const INITIAL: PolicyVersion = PolicyVersion(0);

    pub fn get(self) -> i64 {
        self.0
    }

    /// The version the next train step produces.
    pub fn next(self) -> Self {
        Self(self.0 + 1)
    }
}

impl fmt::Display for PolicyVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<i64> for PolicyVersion {
    fn from(v: i64) -> Self {
        Self(v)
    }
}

impl From<i32> for PolicyVersion {
    fn from(v: i32) -> Self {
        Self(i64::from(v))
    }
}

impl From<PolicyVersion> for i64 {
    fn from(v: PolicyVersion) -> Self {
        v.0
    }
}

/// Narrowing to the `i32` of the batch header and the database columns: fails (rather than
/// wrapping) past `i32::MAX` steps.
impl TryFrom<PolicyVersion> for i32 {
    type Error = std::num::TryFromIntError;

    fn try_from(v: PolicyVersion) -> Result<Self, Self::Error> {
        i32::try_from(v.0)
    }
}

impl PartialEq<i64> for PolicyVersion {
    fn eq(&self, other: &i64) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::PolicyVersion;

    #[test]
    fn a_bare_integer_on_the_wire() {
        let v = PolicyVersion::from(7_i32);
        assert_eq!(serde_json::to_string(&v).ok().as_deref(), Some("7"));
        let back: Option<PolicyVersion> = serde_json::from_str("7").ok();
        assert_eq!(back, Some(PolicyVersion(7)));
        assert_eq!(v.to_string(), "7");
        assert_eq!(i64::from(v.next()), 8);
        assert_eq!(i32::try_from(v).ok(), Some(7));
        assert!(i32::try_from(PolicyVersion(i64::from(i32::MAX) + 1)).is_err());
    }
}
