//! Citation checking by the benchmarks' protocols (benchmarks.md §2 FACT, §5 SQA): a report's
//! sections with their cited sources (AstaBench's sections JSON, or built from an answer's
//! `<cite>` tags and the sources of its trace as DR Tulu's converter does), AstaBench's
//! half-credit rule for sources that carry no quote, its Cite-P / Cite-R aggregation
//! (`all_at_once` mode, `citation_eval.py`), and DeepResearch Bench FACT's fact triples grouped
//! by URL with its pooled accuracy and effective citations (`utils/{extract,validate,stat}.py`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

/// A retrieved source the agent could cite (one snippet or page of its trace).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Source {
    pub id: String,
    pub title: String,
    pub url: Option<String>,
    pub text: String,
}

/// One cited source of a section as the citation judge sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SectionCitation {
    pub id: String,
    pub title: String,
    /// The quoted text (snippets joined), or the title-only stub.
    pub text: String,
    /// The source carries no usable quote: a supporting vote for it earns half credit.
    pub half_credit: bool,
}

/// One section of a report with its citations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Section {
    pub title: String,
    pub text: String,
    pub citations: Vec<SectionCitation>,
}

/// What a title-only source is shown as (AstaBench replaces it by a stub and gives half credit).
pub const TITLE_ONLY: &str = "Content unavailable; the source's title is: ";

/// A citation as judged: the quote, or the stub when the snippets are empty, contained verbatim
/// in the section text, or just the title.
fn section_citation(id: &str, title: &str, snippets: &str, section_text: &str) -> SectionCitation {
    let s = snippets.trim();
    let title_only = s.is_empty()
        || section_text.contains(s)
        || s.eq_ignore_ascii_case(title.trim())
        || s.starts_with(TITLE_ONLY);
    SectionCitation {
        id: id.to_string(),
        title: title.to_string(),
        text: if title_only {
            format!("{TITLE_ONLY}{}", title.trim())
        } else {
            s.to_string()
        },
        half_credit: title_only,
    }
}

/// The sections of AstaBench's agent output `{"sections": [{title, text, citations: [{id,
/// title, snippets: [str]}]}]}` (or wrapped in `{"response": ...}`); `None` when the answer is
/// not that JSON.
pub fn asta_sections(answer: &str) -> Option<Vec<Section>> {
    let v: serde_json::Value = serde_json::from_str(answer.trim()).ok()?;
    let v = v.get("response").unwrap_or(&v);
    let sections = v.get("sections")?.as_array()?;
    Some(
        sections
            .iter()
            .map(|s| {
                let text = s["text"].as_str().unwrap_or("").to_string();
                let citations = s["citations"]
                    .as_array()
                    .map(|cs| {
                        cs.iter()
                            .map(|c| {
                                let snippets = match &c["snippets"] {
                                    serde_json::Value::Array(a) => a
                                        .iter()
                                        .filter_map(|x| x.as_str())
                                        .collect::<Vec<_>>()
                                        .join("..."),
                                    serde_json::Value::String(x) => x.clone(),
                                    _ => String::new(),
                                };
                                let id = match &c["id"] {
                                    serde_json::Value::String(x) => x.clone(),
                                    other => other.to_string(),
                                };
                                section_citation(
                                    &id,
                                    c["title"].as_str().unwrap_or(""),
                                    &snippets,
                                    &text,
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                Section {
                    title: s["title"].as_str().unwrap_or("").to_string(),
                    text,
                    citations,
                }
            })
            .collect(),
    )
}

/// A cited answer as sections, as DR Tulu's `convert_to_asta_format.py` builds them: split on
/// markdown headers; `<cite id="a,b">x</cite>` written as `x [a][b]`; each cited id's title and
/// text taken from the trace's sources (an id the trace lacks has no quote: title-only stub).
pub fn sections_from_answer(answer: &str, sources: &[Source]) -> Vec<Section> {
    let by_id: HashMap<&str, &Source> = sources.iter().map(|s| (s.id.as_str(), s)).collect();
    let mut out = Vec::new();
    let mut title = String::new();
    let mut body: Vec<&str> = Vec::new();
    let flush = |title: &str, body: &[&str], out: &mut Vec<Section>| {
        let raw = body.join("\n");
        if raw.trim().is_empty() {
            return;
        }
        let (text, ids) = bracket_citations(raw.trim(), "");
        let citations = ids
            .iter()
            .map(|id| match by_id.get(id.as_str()) {
                Some(s) => section_citation(id, &s.title, &s.text, &text),
                None => section_citation(id, id, "", &text),
            })
            .collect();
        out.push(Section {
            title: title.to_string(),
            text,
            citations,
        });
    };
    for line in answer.lines() {
        let t = line.trim_start();
        if t.starts_with('#') {
            flush(&title, &body, &mut out);
            body.clear();
            title = t.trim_start_matches('#').trim().to_string();
        } else {
            body.push(line);
        }
    }
    flush(&title, &body, &mut out);
    out
}

/// `<cite id="a,b">x</cite>` → `x [a]{sep}[b]` (SQA's converter writes `x [a][b]`, DRB's
/// formatter `x [a] [b]`), with the distinct cited ids in order of first use.
pub fn bracket_citations(text: &str, sep: &str) -> (String, Vec<String>) {
    let mut ids: Vec<String> = Vec::new();
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("<cite") {
        out.push_str(&rest[..open]);
        let after = &rest[open..];
        let Some(gt) = after.find('>') else {
            rest = "";
            break;
        };
        let cited = crate::domain::judge::citation::cite_ids(&after["<cite".len()..gt]);
        let body = &after[gt + 1..];
        let end = body.find("</cite>").unwrap_or(body.len());
        out.push_str(body[..end].trim());
        for (i, id) in cited.into_iter().enumerate() {
            out.push_str(if i == 0 { " " } else { sep });
            out.push_str(&format!("[{id}]"));
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        rest = body.get(end + "</cite>".len()..).unwrap_or("");
    }
    out.push_str(rest);
    (out, ids)
}

/// One claim of a section as the citation judge returned it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimJudgement {
    pub text: String,
    pub supporting: Vec<String>,
    pub non_supporting: Vec<String>,
    pub is_fully_supported: bool,
}

/// The counts one section contributes (AstaBench `score_citation_group`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupCounts {
    pub n_attributable: usize,
    pub n_extrapolatory: usize,
    pub n_half_credit_claims: usize,
    /// Per claim: supporting ids, non-supporting ids, supporting ids that are title-only.
    pub claims: Vec<(usize, usize, usize)>,
}

/// `[1]`, `(1)` and `1` name the same citation.
fn clean_id(id: &str) -> String {
    id.chars().filter(|c| !"[]()".contains(*c)).collect()
}

/// A section without citations: every sentence is extrapolatory.
pub fn uncited_group(sentences: usize) -> GroupCounts {
    GroupCounts {
        n_extrapolatory: sentences,
        ..Default::default()
    }
}

/// Count a judged section: a claim is attributable when fully supported by at least one
/// supporting id; it is a half-credit claim when all its supporting ids are title-only.
pub fn group_counts(claims: &[ClaimJudgement], citations: &[SectionCitation]) -> GroupCounts {
    let half: BTreeSet<String> = citations
        .iter()
        .filter(|c| c.half_credit)
        .map(|c| clean_id(&c.id))
        .collect();
    let mut g = GroupCounts::default();
    for c in claims {
        let supported = c.is_fully_supported && !c.supporting.is_empty();
        if supported {
            g.n_attributable += 1;
        } else {
            g.n_extrapolatory += 1;
        }
        let sup: BTreeSet<String> = c.supporting.iter().map(|s| clean_id(s)).collect();
        let p = sup.intersection(&half).count();
        let s = c.supporting.len();
        if supported && s == p {
            g.n_half_credit_claims += 1;
        }
        g.claims.push((s, c.non_supporting.len(), p));
    }
    g
}

/// Cite-R and Cite-P of an item over its sections:
/// recall = (n_attributable − 0.5·n_half_credit) / (n_attributable + n_extrapolatory);
/// precision = mean over claims with any cited id of (s − 0.5·p) / (s + e). Both 0 when
/// undefined, as AstaBench scores them.
pub fn citation_scores(groups: &[GroupCounts]) -> (f64, f64) {
    let (mut att, mut ext, mut half) = (0usize, 0usize, 0usize);
    let mut precisions = Vec::new();
    for g in groups {
        att += g.n_attributable;
        ext += g.n_extrapolatory;
        half += g.n_half_credit_claims;
        for &(s, e, p) in &g.claims {
            if s + e > 0 {
                precisions.push((s as f64 - 0.5 * p as f64) / (s + e) as f64);
            }
        }
    }
    let recall = if att + ext > 0 {
        (att as f64 - 0.5 * half as f64) / (att + ext) as f64
    } else {
        0.0
    };
    let precision = if precisions.is_empty() {
        0.0
    } else {
        precisions.iter().sum::<f64>() / precisions.len() as f64
    };
    (recall, precision)
}

/// One cited statement of a DRB article (FACT's extraction output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FactTriple {
    pub fact: String,
    pub ref_idx: String,
    pub url: String,
}

/// Drop a `#:~:text=` fragment (FACT trims them before grouping and fetching).
pub fn clean_url(url: &str) -> String {
    match url.find("#:~:text=") {
        Some(i) => url[..i].trim().to_string(),
        None => url.trim().to_string(),
    }
}

/// Markdown links in a fact keep their text (FACT removes them before validation).
pub fn clean_fact(fact: &str) -> String {
    let mut out = String::with_capacity(fact.len());
    let mut rest = fact;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        match after.find("](") {
            Some(mid) if !after[..mid].contains('[') => {
                let link = &after[mid + 2..];
                match link.find(')') {
                    Some(close) => {
                        out.push_str(&rest[..open]);
                        out.push_str(&after[..mid]);
                        rest = &link[close + 1..];
                    }
                    None => break,
                }
            }
            _ => {
                out.push_str(&rest[..=open]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.trim().to_string()
}

/// Triples grouped by cleaned URL (sorted, so a group's index is stable across a resume); a
/// triple without a URL is resolved through `resolve` (its reference index → URL), else dropped.
pub fn group_by_url(
    triples: &[FactTriple],
    resolve: &dyn Fn(&str) -> Option<String>,
) -> BTreeMap<String, Vec<String>> {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in triples {
        let url = if t.url.trim().is_empty() {
            match resolve(t.ref_idx.trim()) {
                Some(u) => u,
                None => continue,
            }
        } else {
            t.url.clone()
        };
        let url = clean_url(&url);
        if url.is_empty() {
            continue;
        }
        groups.entry(url).or_default().push(clean_fact(&t.fact));
    }
    groups
}

/// FACT's judgement of one fact against its page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Support {
    Supported,
    Unsupported,
    Unknown,
}

/// One article's FACT counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FactTally {
    /// Citations after deduplication.
    pub citations: usize,
    pub supported: usize,
    pub unsupported: usize,
    pub unknown: usize,
    /// URL groups left unscored (page or validation failed).
    pub errored_groups: usize,
}

/// FACT over a set of articles: pooled citation accuracy Σsupported / Σ(supported +
/// unsupported), effective citations Σsupported / #articles with a citation, and citations per
/// such article (`utils/stat.py`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FactSummary {
    pub articles_with_citations: usize,
    pub citation_accuracy: Option<f64>,
    pub effective_citations: Option<f64>,
    pub citations_per_article: Option<f64>,
}

pub fn fact_summary(tallies: &[FactTally]) -> FactSummary {
    let with: Vec<&FactTally> = tallies.iter().filter(|t| t.citations > 0).collect();
    let n = with.len();
    let sup: usize = with.iter().map(|t| t.supported).sum();
    let uns: usize = with.iter().map(|t| t.unsupported).sum();
    let cits: usize = with.iter().map(|t| t.citations).sum();
    FactSummary {
        articles_with_citations: n,
        citation_accuracy: (sup + uns > 0).then(|| sup as f64 / (sup + uns) as f64),
        effective_citations: (n > 0).then(|| sup as f64 / n as f64),
        citations_per_article: (n > 0).then(|| cits as f64 / n as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(sup: &[&str], non: &[&str], full: bool) -> ClaimJudgement {
        ClaimJudgement {
            text: "x".into(),
            supporting: sup.iter().map(|s| s.to_string()).collect(),
            non_supporting: non.iter().map(|s| s.to_string()).collect(),
            is_fully_supported: full,
        }
    }

    #[test]
    fn dr_tulu_conversion_splits_headers_and_takes_quotes_from_the_trace() {
        let sources = vec![
            Source {
                id: "s1".into(),
                title: "Pore pressure study".into(),
                url: Some("https://a.example/1".into()),
                text: "Pore pressure rose by 12% under cyclic loading.".into(),
            },
            Source {
                id: "s2".into(),
                title: "Title only".into(),
                url: None,
                text: "".into(),
            },
        ];
        let answer = "Intro line.\n# Findings\n<cite id=\"s1,s2\">Pressure rose 12%.</cite> More text.\n## Gaps\n<cite id=\"zz\">Unknown.</cite>";
        let s = sections_from_answer(answer, &sources);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].title, "");
        assert!(s[0].citations.is_empty());
        assert_eq!(s[1].title, "Findings");
        assert_eq!(s[1].text, "Pressure rose 12%. [s1][s2] More text.");
        assert_eq!(s[1].citations.len(), 2);
        assert!(!s[1].citations[0].half_credit);
        assert_eq!(s[1].citations[0].text, sources[0].text);
        assert!(s[1].citations[1].half_credit);
        assert_eq!(s[1].citations[1].text, format!("{TITLE_ONLY}Title only"));
        // An id the trace does not have: no quote, half credit at most.
        assert!(s[2].citations[0].half_credit);
    }

    #[test]
    fn asta_json_with_quotes_contained_in_the_text_is_title_only() {
        let j = r#"{"response": {"sections": [{"title": "A", "text": "Water boils at 100 C at sea level.",
            "citations": [{"id": "[1]", "title": "Boiling", "snippets": ["boils at 100 C"]},
                          {"id": "[2]", "title": "Physics", "snippets": ["Pressure lowers the boiling point.", "At altitude."]},
                          {"id": "[3]", "title": "Empty", "snippets": []}]}]}}"#;
        let s = asta_sections(j).unwrap();
        let c = &s[0].citations;
        assert!(c[0].half_credit, "quote copied from the text itself");
        assert!(!c[1].half_credit);
        assert_eq!(
            c[1].text,
            "Pressure lowers the boiling point....At altitude."
        );
        assert!(c[2].half_credit);
        assert!(asta_sections("plain text").is_none());
    }

    #[test]
    fn citation_scores_match_a_hand_computation() {
        let cits = vec![
            section_citation("[1]", "t1", "quote one", "text"),
            section_citation("[2]", "t2", "", "text"),
        ];
        // Claim a: supported by [1] and [2] (one title-only) -> precision (2 - 0.5)/2 = 0.75.
        // Claim b: supported only by [2] (title-only) -> attributable, half-credit claim;
        //          precision (1 - 0.5)/1 = 0.5.
        // Claim c: [1] does not support it -> extrapolatory; precision 0/1 = 0.
        // Claim d: no ids at all, not supported -> extrapolatory, no precision term.
        let claims = vec![
            claim(&["[1]", "2"], &[], true),
            claim(&["(2)"], &[], true),
            claim(&[], &["1"], false),
            claim(&[], &[], true),
        ];
        let g = group_counts(&claims, &cits);
        assert_eq!(g.n_attributable, 2);
        assert_eq!(g.n_extrapolatory, 2);
        assert_eq!(g.n_half_credit_claims, 1);
        // A second section without citations and 3 sentences.
        let (recall, precision) = citation_scores(&[g, uncited_group(3)]);
        // recall = (2 - 0.5) / (2 + 2 + 3)
        assert!((recall - 1.5 / 7.0).abs() < 1e-12, "{recall}");
        assert!((precision - (0.75 + 0.5 + 0.0) / 3.0).abs() < 1e-12);
        assert_eq!(citation_scores(&[]), (0.0, 0.0));
    }

    #[test]
    fn fact_cleaning_grouping_and_pooled_accuracy() {
        assert_eq!(
            clean_url("https://x.org/a#:~:text=foo%20bar"),
            "https://x.org/a"
        );
        assert_eq!(
            clean_fact("GDP grew 3% [IMF](https://imf.org) in 2023 [1]."),
            "GDP grew 3% IMF in 2023 [1]."
        );
        let t = |f: &str, r: &str, u: &str| FactTriple {
            fact: f.into(),
            ref_idx: r.into(),
            url: u.into(),
        };
        let triples = vec![
            t("b fact", "2", "https://b.org#:~:text=x"),
            t("a fact", "1", "https://a.org"),
            t("b again", "2", "https://b.org"),
            t("resolved", "3", ""),
            t("dropped", "9", ""),
        ];
        let resolve = |r: &str| (r == "3").then(|| "https://c.org".to_string());
        let g = group_by_url(&triples, &resolve);
        assert_eq!(
            g.keys().cloned().collect::<Vec<_>>(),
            vec!["https://a.org", "https://b.org", "https://c.org"]
        );
        assert_eq!(g["https://b.org"], vec!["b fact", "b again"]);
        let tallies = vec![
            FactTally {
                citations: 4,
                supported: 3,
                unsupported: 1,
                ..Default::default()
            },
            FactTally {
                citations: 2,
                supported: 0,
                unsupported: 1,
                unknown: 1,
                ..Default::default()
            },
            FactTally::default(),
        ];
        let s = fact_summary(&tallies);
        assert_eq!(s.articles_with_citations, 2);
        assert_eq!(s.citation_accuracy, Some(3.0 / 5.0));
        assert_eq!(s.effective_citations, Some(1.5));
        assert_eq!(s.citations_per_article, Some(3.0));
    }
}
