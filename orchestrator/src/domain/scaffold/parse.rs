//! Tolerant parsing of the RubricEM scaffold out of model text that is usually not well-formed
//! XML: stray `<` and `&`, unclosed tags, text outside any root. A hand-rolled lexer recognises
//! only the scaffold's tag vocabulary (and its aliases) and treats everything else as text;
//! quick-xml parses tag attributes and unescapes entities. Nothing here can panic on any input:
//! every slice index is a char boundary the lexer found itself. DR Tulu's think / call_tool /
//! answer / cite grammar (and ReAct's) is a subset of the vocabulary; [`parse_as`] judges such a
//! trajectory by its own scaffold's rules (no plan, no review: everything before the answer is
//! research).
//!
//! Time and memory are linear in the text on any input (hostile model output included). The
//! tree is built in one pass as the lexer finds tags (a closing tag finds its element through its
//! kind's innermost open element, never by scanning the open ones), and is the same tree as
//! before: an unclosed element spans to where an ancestor closes or the text ends. What is read
//! from it is bounded: the text of a kind read at every occurrence (`call_tool`,
//! `state_evaluation`, `cite`) ends at the next opening tag of that kind, so those texts never
//! overlap, and an unclosed element's text ends at most [`MAX_UNCLOSED_TEXT`] bytes after its
//! opening tag. Everything else parses as before.

use std::collections::BTreeMap;
use std::ops::Range;

use quick_xml::events::BytesStart;
use serde::{Deserialize, Serialize};

use super::Scaffold;
use crate::domain::trajectory::Stage;

/// Canonical tag names. Aliases map onto these in [`canonical_tag`].
pub const TAGS: &[&str] = &[
    "think",
    "structured_plan",
    "deep_analysis",
    "rubric",
    "research_plan",
    "call_tool",
    "state_evaluation",
    "review",
    "rubric_review",
    "writing_plan",
    "answer",
    "cite",
    "tool_output",
    "snippet",
    "webpage",
];

/// The canonical name of a scaffold tag (case-insensitive), including the aliases of the paper's
/// main text and of teacher outputs: `analysis`, `rubrics`, `rubrics_review`, `scratchpad`,
/// and `call` as a closer of `call_tool`.
pub fn canonical_tag(name: &str) -> Option<&'static str> {
    canonical_kind(name).and_then(|k| TAGS.get(k).copied())
}

/// How many kinds of tag there are (a kind is an index into [`TAGS`]).
const KINDS: usize = TAGS.len();

/// The tag's kind: its canonical name's index in [`TAGS`].
fn canonical_kind(name: &str) -> Option<usize> {
    const ALIASES: &[(&str, &str)] = &[
        ("analysis", "deep_analysis"),
        ("rubrics", "rubric"),
        ("rubrics_review", "rubric_review"),
        ("scratchpad", "think"),
        ("call", "call_tool"),
    ];
    if let Some(k) = TAGS.iter().position(|t| t.eq_ignore_ascii_case(name)) {
        return Some(k);
    }
    let (_, canonical) = ALIASES.iter().find(|(a, _)| a.eq_ignore_ascii_case(name))?;
    TAGS.iter().position(|t| t == canonical)
}

/// Tool-name variants teachers and models produce, normalised to the production names.
pub fn normalize_tool_name(raw: &str) -> String {
    let k: String = raw
        .trim()
        .to_ascii_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    match k.as_str() {
        "googlesearch" | "googlewebsearch" | "websearch" | "search" | "google" | "serper" => {
            "google_search"
        }
        "snippetsearch"
        | "scholarsearch"
        | "semanticscholar"
        | "semanticscholarsearch"
        | "papersearch"
        | "s2search" => "snippet_search",
        "browsewebpage" | "browse" | "fetchwebpage" | "openurl" | "fetch" => "browse_webpage",
        _ => return raw.trim().to_string(),
    }
    .to_string()
}

#[derive(Debug, Clone, PartialEq)]
enum Lexeme {
    Open {
        name: &'static str,
        kind: usize,
        attrs: BTreeMap<String, String>,
        span: Range<usize>,
        self_closing: bool,
    },
    Close {
        name: &'static str,
        kind: usize,
        span: Range<usize>,
    },
}

/// Longest a tag may be (attributes included) before we stop believing it is one.
const MAX_TAG_LEN: usize = 4096;

/// Longest tag name (or alias) looked at; every name in the vocabulary is shorter.
const MAX_NAME_LEN: usize = 32;

/// Most bytes of text read from one unclosed element (its text ends here, or at the next opening
/// tag of its kind for `call_tool`, `state_evaluation` and `cite`, whichever comes first). About
/// 250k tokens of English: above any trajectory a policy's context holds, so it only cuts hostile
/// megabyte-scale text.
pub const MAX_UNCLOSED_TEXT: usize = 1 << 20;

/// Hand each recognised tag to `emit`, in document order (no list of them is kept).
fn lex(text: &str, mut emit: impl FnMut(Lexeme)) {
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(off) = memchr_lt(&bytes[i..]) {
        let start = i + off;
        i = start + 1;
        let (closing, name_start) = if bytes.get(start + 1) == Some(&b'/') {
            (true, start + 2)
        } else {
            (false, start + 1)
        };
        // Look at one byte past the longest name, so a longer run is refused without scanning it.
        let name_limit = (name_start + MAX_NAME_LEN + 1).min(bytes.len());
        let mut name_end = name_start;
        while name_end < name_limit
            && (bytes[name_end].is_ascii_alphanumeric() || bytes[name_end] == b'_')
        {
            name_end += 1;
        }
        if name_end == name_start || name_end - name_start > MAX_NAME_LEN {
            continue;
        }
        // name_start..name_end is ASCII, so these are char boundaries.
        let Some((kind, name)) = canonical_kind(&text[name_start..name_end])
            .and_then(|k| TAGS.get(k).map(|name| (k, *name)))
        else {
            continue;
        };
        // The tag must end at '>' before any other '<' and within MAX_TAG_LEN.
        let limit = (start + MAX_TAG_LEN).min(bytes.len());
        let mut j = name_end;
        let mut quote: Option<u8> = None;
        let mut end = None;
        while j < limit {
            let b = bytes[j];
            match quote {
                Some(q) if b == q => quote = None,
                Some(_) => {}
                None if b == b'"' || b == b'\'' => quote = Some(b),
                None if b == b'>' => {
                    end = Some(j);
                    break;
                }
                None if b == b'<' => break,
                None => {}
            }
            j += 1;
        }
        let Some(gt) = end else { continue };
        // After the name: end of tag, whitespace, or '/'.
        let after = bytes[name_end];
        if !(after == b'>' || after == b'/' || after.is_ascii_whitespace()) {
            continue;
        }
        let span = start..gt + 1;
        i = gt + 1;
        if closing {
            emit(Lexeme::Close { name, kind, span });
        } else {
            let inner = &text[name_start..gt];
            let self_closing = inner.ends_with('/');
            let inner = inner.strip_suffix('/').unwrap_or(inner);
            emit(Lexeme::Open {
                name,
                kind,
                attrs: parse_attrs(inner, name_end - name_start),
                span,
                self_closing,
            });
        }
    }
}

fn memchr_lt(b: &[u8]) -> Option<usize> {
    memchr::memchr(b'<', b)
}

/// Attributes through quick-xml's lenient (HTML-style) attribute parser: unquoted values and
/// bare names are accepted, duplicates keep the first, values are entity-unescaped when valid.
fn parse_attrs(content: &str, name_len: usize) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let start = BytesStart::from_content(content, name_len);
    let mut attrs = start.html_attributes();
    attrs.with_checks(false);
    for a in attrs {
        let Ok(a) = a else { break };
        let key = String::from_utf8_lossy(a.key.as_ref()).trim().to_string();
        if key.is_empty() {
            continue;
        }
        let value = match a.unescape_value() {
            Ok(v) => v.into_owned(),
            Err(_) => String::from_utf8_lossy(&a.value).into_owned(),
        };
        out.entry(key).or_insert(value);
    }
    out
}

/// Entity-unescape text when it is valid XML text; otherwise return it as written.
pub fn unescape_text(raw: &str) -> String {
    match quick_xml::escape::unescape(raw) {
        Ok(s) => s.into_owned(),
        Err(_) => raw.to_string(),
    }
}

/// One element of the tolerant tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Element {
    pub name: &'static str,
    pub attrs: BTreeMap<String, String>,
    /// The opening tag.
    pub open: Range<usize>,
    /// Between the opening tag and the closing tag (or the end of text when unclosed).
    pub content: Range<usize>,
    /// The closing tag, when there is one.
    pub close: Option<Range<usize>>,
    pub depth: usize,
    /// Index of the parent element in document order.
    pub parent: Option<usize>,
}

impl Element {
    /// Whole element: opening tag through closing tag (or content end).
    pub fn outer(&self) -> Range<usize> {
        self.open.start..self.close.as_ref().map_or(self.content.end, |c| c.end)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ParseIssue {
    /// An element that was still open where its parent closed or the text ended.
    Unclosed { tag: String, at: usize },
    /// A closing tag with no matching open element.
    StrayClose { tag: String, at: usize },
}

/// Build elements in document order from the lexemes: a closing tag closes the nearest open
/// element of its name (implicitly closing anything opened after it); stray closers are noted.
/// Linear: each kind's innermost open element is known (and each open element links to the next
/// one of its kind below it), so a closing tag finds its element without scanning, and every
/// element is popped once. Lexemes are consumed as the lexer finds them.
fn build(text: &str) -> Tree {
    let mut b = Builder::default();
    lex(text, |lx| b.add(lx));
    b.finish(text.len())
}

#[derive(Default)]
struct Builder {
    elems: Vec<Element>,
    kinds: Vec<usize>,
    /// Open elements, outermost first: the element, and the stack position of the next open
    /// element of its kind below it.
    stack: Vec<(usize, Option<usize>)>,
    /// Per kind, the stack position of its innermost open element.
    innermost: [Option<usize>; KINDS],
    issues: Vec<ParseIssue>,
}

impl Builder {
    fn add(&mut self, lx: Lexeme) {
        let Self {
            elems,
            kinds,
            stack,
            innermost,
            issues,
        } = self;
        match lx {
            Lexeme::Open {
                name,
                kind,
                attrs,
                span,
                self_closing,
            } => {
                let idx = elems.len();
                elems.push(Element {
                    name,
                    attrs,
                    open: span.clone(),
                    content: span.end..span.end,
                    close: self_closing.then_some(span.end..span.end),
                    depth: stack.len(),
                    parent: stack.last().map(|&(e, _)| e),
                });
                kinds.push(kind);
                if !self_closing && let Some(slot) = innermost.get_mut(kind) {
                    stack.push((idx, slot.replace(stack.len())));
                }
            }
            Lexeme::Close { name, kind, span } => {
                let found = innermost
                    .get(kind)
                    .copied()
                    .flatten()
                    .and_then(|pos| stack.get(pos).map(|&(e, _)| (pos, e)));
                let Some((pos, e)) = found else {
                    issues.push(ParseIssue::StrayClose {
                        tag: name.into(),
                        at: span.start,
                    });
                    return;
                };
                for &(inner, _) in stack.get(pos + 1..).unwrap_or_default() {
                    elems[inner].content.end = span.start;
                    issues.push(ParseIssue::Unclosed {
                        tag: elems[inner].name.into(),
                        at: elems[inner].open.start,
                    });
                }
                // Pop innermost first, so each kind's innermost is restored in turn.
                for &(popped, below) in stack.get(pos..).unwrap_or_default().iter().rev() {
                    if let Some(slot) = kinds.get(popped).and_then(|&k| innermost.get_mut(k)) {
                        *slot = below;
                    }
                }
                elems[e].content.end = span.start;
                elems[e].close = Some(span);
                stack.truncate(pos);
            }
        }
    }

    /// Elements still open at the end of the text end there, unclosed.
    fn finish(mut self, len: usize) -> Tree {
        for &(e, _) in &self.stack {
            self.elems[e].content.end = len;
            self.issues.push(ParseIssue::Unclosed {
                tag: self.elems[e].name.into(),
                at: self.elems[e].open.start,
            });
        }
        Tree {
            elems: self.elems,
            kinds: self.kinds,
            issues: self.issues,
        }
    }
}

/// What [`build`] makes: the elements, each one's kind (index into [`TAGS`]), the issues.
struct Tree {
    elems: Vec<Element>,
    kinds: Vec<usize>,
    issues: Vec<ParseIssue>,
}

/// The tolerant tree of a text: its scaffold elements in document order (each within its
/// parent) and the issues found while building it. What [`parse`] reads its fields from.
pub fn elements(text: &str) -> (Vec<Element>, Vec<ParseIssue>) {
    let tree = build(text);
    (tree.elems, tree.issues)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallTag {
    /// Normalised tool name (`google_search`, `snippet_search`, `browse_webpage`, …).
    pub name: String,
    /// Attributes other than `name` (e.g. `limit`, `year`, `fieldsOfStudy`).
    pub attrs: BTreeMap<String, String>,
    /// The call's text, entity-unescaped: up to its closing tag, or when unclosed up to the next
    /// `<call_tool>` (at most [`MAX_UNCLOSED_TEXT`] bytes).
    pub query: String,
    /// Byte range of the whole `<call_tool …>…</call_tool>` in the model text.
    pub span: Range<usize>,
    pub closed: bool,
}

impl ToolCallTag {
    /// What the tool runner is asked: the call's query and attributes.
    pub fn args(&self) -> crate::domain::tool::ToolArgs {
        crate::domain::tool::ToolArgs {
            query: self.query.clone(),
            attrs: self.attrs.clone(),
        }
    }
}

/// The policy's own rubric (`<rubric>` in the plan), split into the three categories.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SelfRubric {
    pub knowledge: Vec<String>,
    pub analytical: Vec<String>,
    pub negative: Vec<String>,
    /// Items under no recognisable heading.
    pub other: Vec<String>,
    pub raw: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub deep_analysis: Option<String>,
    pub rubric: Option<SelfRubric>,
    pub research_plan: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Review {
    pub rubric_review: Option<String>,
    pub writing_plan: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Citation {
    pub ids: Vec<String>,
    pub claim: String,
    /// Every id resolves to a snippet the trajectory retrieved.
    pub known: bool,
    pub unknown_ids: Vec<String>,
}

/// Everything the scaffold parser extracts from one trajectory's model text.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Parsed {
    /// The scaffold whose rules the text was parsed by (it decides [`Parsed::failed`]).
    #[serde(default)]
    pub scaffold: Scaffold,
    /// Byte ranges of the four stages; they partition `0..len` in stage order (some may be empty).
    pub stage_spans: [Range<usize>; 4],
    /// Stages whose marker was found (Plan: `</structured_plan>`, Review: `<review>`, Answer: `<answer>`;
    /// Research: at least one tool call after the plan). A scaffold without a plan (DR Tulu,
    /// ReAct) never has Plan or Review present.
    pub stages_present: [bool; 4],
    pub plan: Option<Plan>,
    /// Revised plans written during Research (partial `<structured_plan>` blocks).
    pub plan_revisions: usize,
    pub tool_calls: Vec<ToolCallTag>,
    pub state_evaluations: Vec<String>,
    pub review: Option<Review>,
    pub answer: Option<String>,
    pub answer_closed: bool,
    pub boxed: Option<String>,
    pub citations: Vec<Citation>,
    pub issues: Vec<ParseIssue>,
}

impl Parsed {
    /// The stage of a byte offset in the model text.
    pub fn stage_at(&self, offset: usize) -> Stage {
        for (k, r) in self.stage_spans.iter().enumerate().rev() {
            if offset >= r.start && !r.is_empty() {
                return Stage::ALL[k];
            }
        }
        Stage::Plan
    }

    /// A parse failure as the rollout summaries and evaluations count it, by the rules of the
    /// scaffold the text was parsed as. RubricEM: malformed tags, or no recognised plan or
    /// answer. DR Tulu (and ReAct, whose prompt asks for no plan either): no closed
    /// `<answer>…</answer>`, the one thing DR Tulu's reward code extracts (an answer it cannot
    /// extract scores 0; think and call_tool are optional, a stray or unclosed `<think>` is not
    /// an error).
    pub fn failed(&self) -> bool {
        if self.scaffold.requires_plan() {
            !self.issues.is_empty() || !self.stages_present[0] || self.answer.is_none()
        } else {
            self.answer.is_none() || !self.answer_closed
        }
    }

    /// A compact JSON summary for `trajectories.parsed` (citations in the form the SQL expects).
    /// Bytes of text this result holds (every string it extracted or copied from the input):
    /// what the parser's linear bound is stated over (tests/scaffold_hostile.rs, the
    /// parser_adversarial bench).
    pub fn held_text(&self) -> usize {
        let opt = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        let mut n = 0;
        if let Some(plan) = &self.plan {
            n += opt(&plan.deep_analysis) + opt(&plan.research_plan);
            if let Some(r) = &plan.rubric {
                n += r.raw.len();
                for v in [&r.knowledge, &r.analytical, &r.negative, &r.other] {
                    n += v.iter().map(String::len).sum::<usize>();
                }
            }
        }
        for t in &self.tool_calls {
            n += t.name.len() + t.query.len();
            n += t
                .attrs
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
        }
        n += self
            .state_evaluations
            .iter()
            .map(String::len)
            .sum::<usize>();
        if let Some(r) = &self.review {
            n += opt(&r.rubric_review) + opt(&r.writing_plan);
        }
        n += opt(&self.answer) + opt(&self.boxed);
        for c in &self.citations {
            n += c.claim.len();
            n += c
                .ids
                .iter()
                .chain(&c.unknown_ids)
                .map(String::len)
                .sum::<usize>();
        }
        n
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// The bytes of an element's content that are read as its text: all of it when closed; when
/// unclosed, at most [`MAX_UNCLOSED_TEXT`] bytes (cut at a char boundary); never past `until`
/// (the next opening tag of its kind, for the kinds read at every occurrence).
fn text_range(text: &str, e: &Element, until: Option<usize>) -> Range<usize> {
    let mut end = e.content.end;
    if e.close.is_none() {
        end = end.min(text.floor_char_boundary(e.content.start.saturating_add(MAX_UNCLOSED_TEXT)));
    }
    if let Some(u) = until {
        end = end.min(u);
    }
    // `until` is an opening tag after this element's, so never before its content starts.
    e.content.start..end.max(e.content.start)
}

fn content(text: &str, e: &Element) -> String {
    content_until(text, e, None)
}

fn content_until(text: &str, e: &Element, until: Option<usize>) -> String {
    unescape_text(text[text_range(text, e, until)].trim())
}

/// For each element, where the next element of its kind opens (if one does).
fn next_of_kind(elems: &[Element], kinds: &[usize]) -> Vec<Option<usize>> {
    let mut next = vec![None; elems.len()];
    let mut seen: [Option<usize>; KINDS] = [None; KINDS];
    for ((e, &kind), n) in elems.iter().zip(kinds).zip(next.iter_mut()).rev() {
        if let Some(slot) = seen.get_mut(kind) {
            *n = *slot;
            *slot = Some(e.open.start);
        }
    }
    next
}

fn first_within<'a>(elems: &'a [Element], parent: usize, name: &str) -> Option<&'a Element> {
    let outer = elems[parent].outer();
    elems
        .iter()
        .skip(parent + 1)
        .take_while(|e| e.open.start < outer.end)
        .find(|e| e.name == name)
}

/// Split a self-rubric into knowledge / analytical / negative items by its headings.
pub fn parse_self_rubric(raw: &str) -> SelfRubric {
    #[derive(Clone, Copy)]
    enum Cat {
        Knowledge,
        Analytical,
        Negative,
        Other,
    }
    let mut r = SelfRubric {
        raw: raw.to_string(),
        ..Default::default()
    };
    let mut cat = Cat::Other;
    for line in raw.lines() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let lower = t.to_lowercase();
        let bullet = t.starts_with(['-', '*', '•'])
            || t.chars().next().is_some_and(|c| c.is_ascii_digit()) && t.contains(['.', ')']);
        let heading = !bullet || lower.ends_with(':');
        if heading {
            let new = if lower.contains("knowledge") || lower.contains("checklist") {
                Some(Cat::Knowledge)
            } else if lower.contains("analytic") || lower.contains("synthesis") {
                Some(Cat::Analytical)
            } else if lower.contains("negative")
                || lower.contains("pitfall")
                || lower.contains("avoid")
            {
                Some(Cat::Negative)
            } else {
                None
            };
            if let Some(c) = new {
                cat = c;
                // "Heading: item" on one line keeps the item.
                match t.split_once(':') {
                    Some((_, rest)) if !rest.trim().is_empty() => {}
                    _ => continue,
                }
            }
        }
        let item = t
            .trim_start_matches(|c: char| {
                c == '-' || c == '*' || c == '•' || c.is_ascii_digit() || c == '.' || c == ')'
            })
            .trim();
        let item = if heading {
            item.split_once(':').map_or(item, |(_, rest)| rest.trim())
        } else {
            item
        };
        if item.is_empty() {
            continue;
        }
        let item = item.to_string();
        match cat {
            Cat::Knowledge => r.knowledge.push(item),
            Cat::Analytical => r.analytical.push(item),
            Cat::Negative => r.negative.push(item),
            Cat::Other => r.other.push(item),
        }
    }
    r
}

/// `\boxed{…}` with balanced braces, the last one in the text.
pub fn extract_boxed(text: &str) -> Option<String> {
    let start = text.rfind("\\boxed{")? + "\\boxed{".len();
    let mut depth = 1usize;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(text[start..start + i].trim().to_string());
                }
            }
            _ => {}
        }
    }
    None
}

/// Parse one trajectory's model text (tool outputs excluded) by the RubricEM scaffold's rules.
/// `known_snippets` are the ids the trajectory's tool outputs contained, to flag citations that
/// resolve to nothing.
pub fn parse(text: &str, known_snippets: &dyn Fn(&str) -> bool) -> Parsed {
    parse_as(Scaffold::Rubricem, text, known_snippets)
}

/// Parse one trajectory's text by `scaffold`'s rules. Tool calls, answer, `\boxed{}` and
/// citations are read the same way for every scaffold; the stage spans differ: a scaffold
/// without a plan (DR Tulu, ReAct) puts everything before `<answer>` in Research and the answer
/// in Answer (Plan and Review stay empty), and [`Parsed::failed`] asks for no plan.
pub fn parse_as(scaffold: Scaffold, text: &str, known_snippets: &dyn Fn(&str) -> bool) -> Parsed {
    let mut p = parse_rubricem(text, known_snippets);
    p.scaffold = scaffold;
    if !scaffold.requires_plan() {
        let b_answer = p.stage_spans[3].start;
        p.stage_spans = [0..0, 0..b_answer, b_answer..b_answer, b_answer..text.len()];
        p.stages_present = [false, !p.tool_calls.is_empty(), false, p.answer.is_some()];
    }
    p
}

fn parse_rubricem(text: &str, known_snippets: &dyn Fn(&str) -> bool) -> Parsed {
    let Tree {
        elems,
        kinds,
        issues,
    } = build(text);
    let next = next_of_kind(&elems, &kinds);
    let len = text.len();
    let mut p = Parsed {
        issues,
        ..Default::default()
    };

    // Answer: the first <answer>.
    let answer_el = elems.iter().position(|e| e.name == "answer");
    let b_answer = answer_el.map_or(len, |i| elems[i].open.start);
    // Review: the last <review> before the answer; its span starts at the last <think> before it.
    let review_el = elems
        .iter()
        .rposition(|e| e.name == "review" && e.open.start < b_answer);
    let b_review = match review_el {
        Some(r) => elems
            .iter()
            .filter(|e| e.name == "think" && e.open.start < elems[r].open.start)
            .map(|e| e.open.start)
            .next_back()
            .unwrap_or(elems[r].open.start),
        None => b_answer,
    };
    // Plan: through the first closed </structured_plan> that lies before the review boundary.
    let plan_el = elems.iter().position(|e| e.name == "structured_plan");
    let plan_end = plan_el
        .and_then(|i| elems[i].close.as_ref().map(|c| c.end))
        .filter(|end| *end <= b_review);
    // Without a plan end, the plan never ended: it extends to the next recognised boundary.
    let b_plan = plan_end.unwrap_or(b_review);
    // The review boundary may precede a (late) plan end only when the plan is absent.
    let b_review = b_review.max(b_plan);
    p.stage_spans = [
        0..b_plan,
        b_plan..b_review,
        b_review..b_answer,
        b_answer..len,
    ];

    if let Some(i) = plan_el {
        let get = |name| first_within(&elems, i, name).map(|e| content(text, e));
        p.plan = Some(Plan {
            deep_analysis: get("deep_analysis"),
            rubric: first_within(&elems, i, "rubric").map(|e| parse_self_rubric(&content(text, e))),
            research_plan: get("research_plan"),
        });
        p.plan_revisions = elems
            .iter()
            .filter(|e| e.name == "structured_plan")
            .count()
            .saturating_sub(1);
    }
    for (e, until) in elems
        .iter()
        .zip(&next)
        .filter(|(e, _)| e.name == "call_tool" && e.open.start < b_answer)
    {
        let name = e
            .attrs
            .get("name")
            .map(|n| normalize_tool_name(n))
            .unwrap_or_default();
        let attrs = e
            .attrs
            .iter()
            .filter(|(k, _)| *k != "name")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        p.tool_calls.push(ToolCallTag {
            name,
            attrs,
            query: content_until(text, e, *until),
            span: e.outer(),
            closed: e.close.is_some(),
        });
    }
    p.state_evaluations = elems
        .iter()
        .zip(&next)
        .filter(|(e, _)| e.name == "state_evaluation")
        .map(|(e, until)| content_until(text, e, *until))
        .collect();
    if let Some(r) = review_el {
        p.review = Some(Review {
            rubric_review: first_within(&elems, r, "rubric_review").map(|e| content(text, e)),
            writing_plan: first_within(&elems, r, "writing_plan").map(|e| content(text, e)),
        });
    }
    if let Some(a) = answer_el {
        let ans = &elems[a];
        let ans_text = &text[text_range(text, ans, None)];
        p.answer = Some(ans_text.trim().to_string());
        p.answer_closed = ans.close.is_some();
        p.boxed = extract_boxed(ans_text);
        let outer = ans.outer();
        for (c, until) in elems
            .iter()
            .zip(&next)
            .skip(a + 1)
            .take_while(|(e, _)| e.open.start < outer.end)
            .filter(|(e, _)| e.name == "cite")
        {
            let raw_ids = c
                .attrs
                .get("id")
                .or_else(|| c.attrs.get("ids"))
                .cloned()
                .unwrap_or_default();
            let ids: Vec<String> = raw_ids
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            let unknown_ids: Vec<String> = ids
                .iter()
                .filter(|id| !known_snippets(id))
                .cloned()
                .collect();
            p.citations.push(Citation {
                known: !ids.is_empty() && unknown_ids.is_empty(),
                ids,
                claim: content_until(text, c, *until),
                unknown_ids,
            });
        }
    }
    p.stages_present = [
        plan_end.is_some(),
        p.tool_calls.iter().any(|t| t.span.start >= b_plan),
        review_el.is_some(),
        answer_el.is_some(),
    ];
    p
}
