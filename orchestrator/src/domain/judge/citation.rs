//! The DR Tulu citation reward (method.md B.6): an answer is cut into claims (each `<cite>` span
//! with its ids, and the uncited text between them); a judge gives each claim support and
//! relevance; `r_cit = 0.6·F1 + 0.4·R_fmt`.

use std::collections::BTreeSet;

use super::{Claim, ClaimVerdict};

/// Cut an answer into claims. Uncited pieces without any letter or digit are dropped.
pub fn split_claims(answer: &str) -> Vec<Claim> {
    let mut out = Vec::new();
    let mut rest = answer;
    let push_plain = |s: &str, out: &mut Vec<Claim>| {
        let t = s.trim();
        if t.chars().any(char::is_alphanumeric) {
            out.push(Claim {
                text: t.to_string(),
                ids: vec![],
            });
        }
    };
    while let Some(open) = rest.find("<cite") {
        push_plain(&rest[..open], &mut out);
        let after = &rest[open..];
        let Some(gt) = after.find('>') else {
            rest = "";
            break;
        };
        let attrs = &after["<cite".len()..gt];
        let body = &after[gt + 1..];
        let end = body.find("</cite>").unwrap_or(body.len());
        out.push(Claim {
            text: body[..end].trim().to_string(),
            ids: cite_ids(attrs),
        });
        rest = body.get(end + "</cite>".len()..).unwrap_or("");
    }
    push_plain(rest, &mut out);
    out
}

/// The ids of a `<cite id="a,b">` attribute string (`id` or `ids`, quoted or not).
pub(crate) fn cite_ids(attrs: &str) -> Vec<String> {
    for key in ["ids=", "id="] {
        if let Some(p) = attrs.find(key) {
            let v = attrs[p + key.len()..].trim_start();
            let v = if let Some(q) = v.strip_prefix('"') {
                q.split('"').next().unwrap_or("")
            } else if let Some(q) = v.strip_prefix('\'') {
                q.split('\'').next().unwrap_or("")
            } else {
                v.split_whitespace().next().unwrap_or("")
            };
            return v
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
        }
    }
    vec![]
}

/// The parts of the citation reward, kept for metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CitationReward {
    pub f1: f64,
    /// Fraction of distinct cited ids that exist among retrieved snippets; 0 without citations.
    pub format: f64,
    /// 0.6·F1 + 0.4·format.
    pub reward: f64,
}

/// Combine per-claim verdicts: f(c) = harmonic mean of support and relevance (0 if both 0),
/// F1 = mean over claims.
pub fn citation_reward(
    claims: &[Claim],
    verdicts: &[ClaimVerdict],
    known: &dyn Fn(&str) -> bool,
) -> CitationReward {
    let cited: BTreeSet<&str> = claims
        .iter()
        .flat_map(|c| c.ids.iter().map(String::as_str))
        .collect();
    let format = if cited.is_empty() {
        0.0
    } else {
        cited.iter().filter(|id| known(id)).count() as f64 / cited.len() as f64
    };
    let f: Vec<f64> = verdicts
        .iter()
        .map(|v| {
            let (r, p) = (v.support.clamp(0.0, 1.0), v.relevance.clamp(0.0, 1.0));
            if r + p == 0.0 {
                0.0
            } else {
                2.0 * r * p / (r + p)
            }
        })
        .collect();
    let f1 = if f.is_empty() {
        0.0
    } else {
        f.iter().sum::<f64>() / f.len() as f64
    };
    CitationReward {
        f1,
        format,
        reward: 0.6 * f1 + 0.4 * format,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_alternate_cited_and_uncited() {
        let c = split_claims(
            "Intro text. <cite id=\"a1,b2\">X causes Y.</cite> Then more. <cite ids=c3>Z.</cite>",
        );
        assert_eq!(c.len(), 4);
        assert_eq!(c[0].ids, Vec::<String>::new());
        assert_eq!(c[1].ids, vec!["a1", "b2"]);
        assert_eq!(c[1].text, "X causes Y.");
        assert_eq!(c[2].text, "Then more.");
        assert_eq!(c[3].ids, vec!["c3"]);
    }

    #[test]
    fn unclosed_cite_keeps_its_text() {
        let c = split_claims("A <cite id=x>claim without end");
        assert_eq!(c.len(), 2);
        assert_eq!(c[1].text, "claim without end");
    }

    #[test]
    fn reward_combines_f1_and_format() {
        let claims = split_claims("<cite id=a>one</cite><cite id=zz>two</cite>");
        let v = [
            ClaimVerdict {
                support: 1.0,
                relevance: 1.0,
            },
            ClaimVerdict {
                support: 0.0,
                relevance: 0.0,
            },
        ];
        let r = citation_reward(&claims, &v, &|id| id == "a");
        assert_eq!(r.f1, 0.5);
        assert_eq!(r.format, 0.5);
        assert!((r.reward - 0.5).abs() < 1e-12);
        let none = citation_reward(&[], &[], &|_| true);
        assert_eq!(none.reward, 0.0);
    }
}
