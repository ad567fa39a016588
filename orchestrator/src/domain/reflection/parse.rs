//! Validity of a reflection candidate (method.md A.6.1): both blocks present, closed and
//! non-empty.

/// Generation stops once the takeaways block closes.
pub const STOP: &str = "</reflection_takeaways>";

/// The two blocks of a valid candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct Blocks {
    pub rubrics: String,
    pub takeaways: String,
}

fn block<'a>(text: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = text.find(&open)? + open.len();
    let end = start + text[start..].find(&close)?;
    Some(text[start..end].trim())
}

/// Validity (method.md A.6.1, PROPOSED precise check): both blocks present, closed and
/// non-empty. Returns their trimmed contents.
pub fn parse(text: &str) -> Option<Blocks> {
    let rubrics = block(text, "reflection_rubrics")?;
    let takeaways = block(text, "reflection_takeaways")?;
    if rubrics.is_empty() || takeaways.is_empty() {
        return None;
    }
    Some(Blocks {
        rubrics: rubrics.to_string(),
        takeaways: takeaways.to_string(),
    })
}
