//! Short-answer matching for tasks with a known answer: an answer hits when its normalised
//! words contain the gold answer's normalised words in order (lower case, punctuation and the
//! articles a/an/the dropped), the usual "answer contained" check of open-domain QA.

/// Lower-case words of `text` without punctuation and articles.
fn words(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty() && !matches!(*w, "a" | "an" | "the"))
        .map(str::to_string)
        .collect()
}

/// Whether `answer` contains the known answer `gold`; an empty gold answer never matches.
pub fn contains_answer(gold: &str, answer: &str) -> bool {
    let g = words(gold);
    let a = words(answer);
    !g.is_empty() && a.windows(g.len()).any(|w| w == g.as_slice())
}

#[cfg(test)]
mod tests {
    use super::contains_answer;

    #[test]
    fn word_sequences_not_substrings() {
        assert!(contains_answer(
            "Kauffman Stadium",
            "It was at kauffman stadium."
        ));
        assert!(contains_answer(
            "The Home Rule League",
            "the home-rule league [1]"
        ));
        assert!(contains_answer(
            "3 November 1929",
            "He died on 3 November 1929."
        ));
        // Word boundaries: "Zhao" is not a hit inside "Zhaoxi".
        assert!(!contains_answer("Zhao", "Zhaoxi"));
        assert!(!contains_answer("Kauffman Stadium", "Arrowhead Stadium"));
        assert!(!contains_answer("", "anything"));
        assert!(!contains_answer("the", "the the"));
        assert!(!contains_answer("Tetisheri", ""));
    }
}
