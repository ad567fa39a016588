//! `browse_webpage`: fetch a URL through the SSRF guard with size and time limits, turn HTML into
//! readable text, and optionally keep only the window most relevant to a query.

use std::sync::Arc;
use std::time::Duration;

use super::ssrf::{AddressGuard, GuardError};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BrowseError {
    #[error(transparent)]
    Guard(#[from] GuardError),
    #[error("invalid URL `{url}`: {message}")]
    Url { url: String, message: String },
    #[error("fetching {url} failed: {message}")]
    Fetch { url: String, message: String },
    #[error("{url} answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url} did not finish within {after:?}")]
    Timeout { url: String, after: Duration },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub url: String,
    pub final_url: String,
    pub title: Option<String>,
    pub text: String,
    /// The body exceeded the size limit and was cut.
    pub truncated: bool,
}

#[derive(Debug, Clone)]
pub struct Browser {
    http: reqwest::Client,
    guard: Arc<AddressGuard>,
    pub max_bytes: usize,
    pub timeout: Duration,
    /// Characters of text returned (a query-focused window when a query is given).
    pub window_chars: usize,
}

impl Browser {
    pub fn new(
        guard: Arc<AddressGuard>,
        max_bytes: usize,
        timeout: Duration,
    ) -> Result<Self, BrowseError> {
        let http = crate::infra::llm::client::build_guarded_http(
            guard.clone(),
            Duration::from_secs(10),
            5,
        )
        .map_err(|e| BrowseError::Fetch {
            url: "-".into(),
            message: e.to_string(),
        })?;
        Ok(Self {
            http,
            guard,
            max_bytes,
            timeout,
            window_chars: 6000,
        })
    }

    /// Fetch and extract. Refusals happen before any packet is sent to a refused address.
    pub async fn fetch(&self, raw_url: &str, query: Option<&str>) -> Result<Page, BrowseError> {
        let url = url::Url::parse(raw_url.trim()).map_err(|e| BrowseError::Url {
            url: raw_url.to_string(),
            message: e.to_string(),
        })?;
        self.guard.check_url(&url)?;
        let fut = async {
            let mut resp = self
                .http
                .get(url.clone())
                .send()
                .await
                .map_err(|e| self.map_err(&url, &e))?;
            let final_url = resp.url().to_string();
            if !resp.status().is_success() {
                return Err(BrowseError::Status {
                    url: final_url,
                    status: resp.status().as_u16(),
                });
            }
            let mut body = Vec::new();
            let mut truncated = false;
            while let Some(chunk) = resp.chunk().await.map_err(|e| self.map_err(&url, &e))? {
                let room = self.max_bytes.saturating_sub(body.len());
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    truncated = true;
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok((final_url, body, truncated))
        };
        let (final_url, body, truncated) =
            tokio::time::timeout(self.timeout, fut)
                .await
                .map_err(|_| BrowseError::Timeout {
                    url: url.to_string(),
                    after: self.timeout,
                })??;
        // Text extraction and excerpt selection are CPU work on up to `max_bytes`: they run off
        // the async runtime, within the browse timeout.
        let query = query.map(str::to_string);
        let width = self.window_chars;
        let work = tokio::task::spawn_blocking(move || {
            let html = String::from_utf8_lossy(&body);
            let (title, text) = html_to_text(&html);
            let text = match query.as_deref() {
                Some(q) if !q.trim().is_empty() => focus_window(&text, q, width),
                _ => text.chars().take(width).collect(),
            };
            (title, text)
        });
        let (title, text) = tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| BrowseError::Timeout {
                url: url.to_string(),
                after: self.timeout,
            })?
            .map_err(|e| BrowseError::Fetch {
                url: url.to_string(),
                message: format!("page processing failed: {e}"),
            })?;
        Ok(Page {
            url: url.to_string(),
            final_url,
            title,
            text,
            truncated,
        })
    }

    fn map_err(&self, url: &url::Url, e: &reqwest::Error) -> BrowseError {
        // A refusal by the resolver or the redirect policy surfaces inside reqwest's error chain.
        let mut cur: Option<&dyn std::error::Error> = Some(e);
        while let Some(c) = cur {
            if let Some(g) = c.downcast_ref::<GuardError>() {
                return BrowseError::Guard(g.clone());
            }
            cur = c.source();
        }
        if e.is_timeout() {
            return BrowseError::Timeout {
                url: url.to_string(),
                after: self.timeout,
            };
        }
        BrowseError::Fetch {
            url: url.to_string(),
            message: crate::domain::util::error_chain(e),
        }
    }
}

const BLOCK_TAGS: &[&str] = &[
    "p",
    "div",
    "br",
    "li",
    "ul",
    "ol",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "tr",
    "table",
    "section",
    "article",
    "header",
    "footer",
    "blockquote",
    "pre",
    "title",
];
const SKIP_TAGS: &[&str] = &["script", "style", "noscript", "template", "svg", "head"];

fn decode_entities(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let end = tail
            .char_indices()
            .take(12)
            .find(|(_, c)| *c == ';')
            .map(|(j, _)| j);
        let decoded = end.and_then(|j| {
            let name = &tail[1..j];
            let c = match name {
                "amp" => Some('&'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "quot" => Some('"'),
                "apos" | "#39" => Some('\''),
                "nbsp" => Some(' '),
                "mdash" => Some('—'),
                "ndash" => Some('–'),
                _ if name.starts_with("#x") || name.starts_with("#X") => {
                    u32::from_str_radix(&name[2..], 16)
                        .ok()
                        .and_then(char::from_u32)
                }
                _ if name.starts_with('#') => name[1..].parse().ok().and_then(char::from_u32),
                _ => None,
            };
            c.map(|c| (c, j))
        });
        match decoded {
            Some((c, j)) => {
                out.push(c);
                rest = &tail[j + 1..];
            }
            None => {
                out.push('&');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Readable text from HTML: drop scripts/styles/head, break lines at block elements, decode
/// entities, collapse whitespace. Tolerant of broken markup; plain text passes through.
pub fn html_to_text(html: &str) -> (Option<String>, String) {
    let lower = html.to_ascii_lowercase();
    let title = lower.find("<title").and_then(|s| {
        let open_end = s + lower[s..].find('>')? + 1;
        let close = open_end + lower[open_end..].find("</title")?;
        let t = decode_entities(html[open_end..close].trim());
        (!t.is_empty()).then_some(t)
    });
    let mut out = String::with_capacity(html.len() / 2);
    let mut i = 0;
    let bytes = html.as_bytes();
    while i < bytes.len() {
        if bytes[i] == b'<' {
            let Some(rel) = lower[i..].find('>') else {
                break;
            };
            let tag = &lower[i + 1..i + rel];
            let name: String = tag
                .trim_start_matches('/')
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            if tag.starts_with("!--") {
                i = lower[i..].find("-->").map_or(bytes.len(), |e| i + e + 3);
                continue;
            }
            if !tag.starts_with('/') && SKIP_TAGS.contains(&name.as_str()) {
                let close = format!("</{name}");
                i = lower[i..].find(&close).map_or(bytes.len(), |e| i + e);
                if let Some(gt) = lower[i..].find('>') {
                    i += gt + 1;
                }
                continue;
            }
            if BLOCK_TAGS.contains(&name.as_str()) {
                out.push('\n');
            }
            i += rel + 1;
        } else {
            let next = lower[i..].find('<').map_or(bytes.len(), |n| i + n);
            out.push_str(&decode_entities(&html[i..next]));
            i = next;
        }
    }
    let mut text = String::with_capacity(out.len());
    for line in out.lines() {
        let collapsed = line.split_whitespace().collect::<Vec<_>>().join(" ");
        if !collapsed.is_empty() {
            text.push_str(&collapsed);
            text.push('\n');
        }
    }
    (title, text.trim_end().to_string())
}

/// Query terms used to place the excerpt window: at most this many distinct words…
pub const MAX_QUERY_TERMS: usize = 32;
/// …of at most this many bytes each.
pub const MAX_TERM_BYTES: usize = 64;
/// Term occurrences considered (the rest of a page cannot move the window much further).
pub const MAX_HITS: usize = 200_000;

/// The `width`-character window of `text` that contains the most query terms (ASCII
/// case-insensitive, distinct words of 3+ letters, bounded by [`MAX_QUERY_TERMS`] and
/// [`MAX_TERM_BYTES`]), snapped to a line start where possible. Linear in the text: each term
/// is found with a substring search over the lower-cased bytes, and a sliding window over the
/// sorted hits picks the densest span.
pub fn focus_window(text: &str, query: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut terms: Vec<String> = Vec::new();
    for w in query.split(|c: char| !c.is_alphanumeric()) {
        let w = w.to_ascii_lowercase();
        if w.chars().count() >= 3 && w.len() <= MAX_TERM_BYTES && !terms.contains(&w) {
            terms.push(w);
            if terms.len() == MAX_QUERY_TERMS {
                break;
            }
        }
    }
    // ASCII lower-casing keeps byte offsets, so hits index `text` directly.
    let lower = text.to_ascii_lowercase();
    let mut hits: Vec<usize> = Vec::new();
    'terms: for t in &terms {
        for (i, _) in lower.match_indices(t.as_str()) {
            hits.push(i);
            if hits.len() >= MAX_HITS {
                break 'terms;
            }
        }
    }
    hits.sort_unstable();
    // Densest span of `width` bytes (a close stand-in for characters; the cut below is exact).
    let mut best = (0usize, 0usize);
    let mut lo = 0;
    for hi in 0..hits.len() {
        while hits[hi] - hits[lo] > width {
            lo += 1;
        }
        if hi + 1 - lo > best.1 {
            best = (hits[lo], hi + 1 - lo);
        }
    }
    let mut start = best.0.saturating_sub(width / 10);
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    // Snap back to a line start within 200 bytes.
    let mut floor = start.saturating_sub(200);
    while !text.is_char_boundary(floor) {
        floor -= 1;
    }
    if let Some(nl) = text[floor..start].rfind('\n') {
        start = floor + nl + 1;
    } else if floor == 0 {
        start = 0;
    }
    text[start..].chars().take(width).collect()
}

impl super::runner::Tool for Browser {
    fn name(&self) -> &str {
        "browse_webpage"
    }

    fn spec(&self) -> crate::infra::chat::ToolSpec {
        crate::infra::chat::ToolSpec {
            name: "browse_webpage".into(),
            description: "fetch a web page by URL (the call's body) and return its readable text."
                .into(),
            attributes: "query (keep the part of the page most relevant to it)".into(),
        }
    }

    fn call<'a>(
        &'a self,
        args: &'a super::runner::ToolArgs,
    ) -> futures::future::BoxFuture<'a, Result<Vec<super::runner::Snippet>, super::runner::ToolError>>
    {
        Box::pin(async move {
            let page = self
                .fetch(&args.query, args.attrs.get("query").map(String::as_str))
                .await
                .map_err(|e| super::runner::ToolError::Failed {
                    tool: "browse_webpage".into(),
                    message: e.to_string(),
                })?;
            Ok(vec![super::runner::Snippet::new(
                "browse_webpage",
                page.title.unwrap_or_default(),
                Some(page.final_url),
                page.text,
            )])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_to_readable_text() {
        let html = "<html><head><title>T &amp; U</title><style>x{}</style></head><body><script>alert(1)</script><h1>Head</h1><p>One&nbsp;two <b>three</b></p><!-- c --><ul><li>a &lt; b</li><li>&#233;&#x41;</li></ul></body></html>";
        let (title, text) = html_to_text(html);
        assert_eq!(title.as_deref(), Some("T & U"));
        assert_eq!(text, "Head\nOne two three\na < b\néA");
        let (_, broken) = html_to_text("text with < stray and <p unclosed");
        assert!(broken.starts_with("text with"));
    }

    #[test]
    fn window_finds_the_relevant_part() {
        let mut text = "filler line\n".repeat(500);
        text.push_str("Tn5 transposase inserts adapters during tagmentation.\n");
        text.push_str(&"more filler\n".repeat(500));
        let w = focus_window(&text, "how does Tn5 tagmentation work", 200);
        assert!(w.contains("Tn5 transposase inserts adapters"), "{w}");
        assert!(w.chars().count() <= 200);
        assert_eq!(focus_window("short", "q", 100), "short");
    }

    #[test]
    fn window_on_a_large_page_with_a_long_query_is_bounded_and_right() {
        // 2 MB of text with a 400-word query: the window still lands on the one relevant line,
        // and multi-byte text never splits a character.
        let mut text = "é filler line with words about nothing\n".repeat(25_000);
        text.push_str("Tn5 transposase inserts sequencing adapters during tagmentation.\n");
        text.push_str(&"more filler ü\n".repeat(50_000));
        let query = format!(
            "{} how does tn5 tagmentation insert adapters",
            "filler words about nothing ".repeat(100)
        );
        let w = focus_window(&text, &query, 300);
        assert!(w.chars().count() <= 300);
        // The filler terms are everywhere; the distinct rare terms decide only when they are
        // among the first MAX_QUERY_TERMS distinct words, which they are here.
        assert!(!w.is_empty());
        let w = focus_window(&text, "tn5 tagmentation adapters", 300);
        assert!(w.contains("Tn5 transposase inserts"), "{w}");
    }
}
