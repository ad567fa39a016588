//! vLLM's repetition rule (its `repetition_detection` request field), in one place for both
//! sides: `trainer serve` stops a sample with it, and the orchestrator finds the loop a server
//! stopped (to cut it before a forced answer), so the two always agree on what a loop is.

/// The tokens of the loop that closes `ids`: `min_count x p` for the smallest block size `p` in
/// `min_pattern_size..=max_pattern_size` (a `min_pattern_size` of 0 reads as 1, as vLLM reads
/// it) whose last `min_count` copies end `ids`; `None` when no block does, when
/// `max_pattern_size` is 0, or when `min_count` is under 2 (one copy is no loop). Per block size
/// it compares the newest token with the one a block earlier first, so a server calling it
/// after every sampled token pays about one comparison per size while nothing repeats.
pub fn loop_len(
    ids: &[u32],
    min_pattern_size: usize,
    max_pattern_size: usize,
    min_count: usize,
) -> Option<usize> {
    if min_count < 2 {
        return None;
    }
    let n = ids.len();
    for p in min_pattern_size.max(1)..=max_pattern_size {
        let span = p.checked_mul(min_count).filter(|&span| span <= n)?;
        let tail = &ids[n - span..];
        if (p..span).rev().all(|i| tail[i] == tail[i - p]) {
            return Some(span);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::loop_len;

    #[test]
    fn the_smallest_block_whose_copies_close_the_tokens() {
        assert_eq!(loop_len(&[9, 1, 2, 1, 2, 1, 2], 1, 4, 3), Some(6));
        assert_eq!(loop_len(&[5; 6], 1, 4, 3), Some(3), "1 x 3, not 2 x 3");
        assert_eq!(loop_len(&[5; 6], 0, 4, 3), Some(3), "min 0 reads as 1");
        assert_eq!(loop_len(&[5; 6], 2, 4, 3), Some(6));
        assert_eq!(loop_len(&[1, 2, 1, 2, 1, 3], 1, 4, 3), None);
        assert_eq!(loop_len(&[5; 6], 1, 0, 3), None, "max 0: off");
        assert_eq!(loop_len(&[5; 6], 1, 4, 1), None, "one copy is no loop");
        assert_eq!(loop_len(&[], 1, 4, 2), None);
    }
}
