//! JSON Lines, read one way everywhere: blank lines are skipped, every other line is one JSON
//! value, and each row comes with its 1-based line number so a caller's error can name the
//! file, the line and the problem. Callers map the `serde_json` error into their own error type.

use serde::de::DeserializeOwned;

/// The non-blank lines of `text` parsed as `T`, each with its 1-based line number.
pub fn rows<T: DeserializeOwned>(
    text: &str,
) -> impl Iterator<Item = (usize, Result<T, serde_json::Error>)> + '_ {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, serde_json::from_str::<T>(l)))
}

/// Why a line of a streamed file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Json(#[from] serde_json::Error),
}

/// [`rows`] over a reader, line by line, for files too large to hold twice in memory.
pub fn read_rows<T: DeserializeOwned, R: std::io::BufRead>(
    reader: R,
) -> impl Iterator<Item = (usize, Result<T, LineError>)> {
    reader
        .lines()
        .enumerate()
        .filter(|(_, l)| l.as_ref().map_or(true, |l| !l.trim().is_empty()))
        .map(|(i, l)| {
            let parsed = l
                .map_err(LineError::from)
                .and_then(|l| serde_json::from_str::<T>(&l).map_err(LineError::from));
            (i + 1, parsed)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_lines_are_skipped_and_line_numbers_are_the_files() {
        let got: Vec<(usize, Result<serde_json::Value, _>)> =
            rows("{\"a\":1}\n\n  \n{\"a\":2}\nnot json\n").collect();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].0, 1);
        assert_eq!(got[1].0, 4);
        assert_eq!(
            got[1].1.as_ref().map(|v| v["a"].clone()).ok(),
            Some(2.into())
        );
        assert_eq!(got[2].0, 5);
        assert!(got[2].1.is_err());
    }
}
