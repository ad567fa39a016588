//! `Batch::decode` on hostile bodies, as properties: arbitrary bytes (with and without the
//! magic), and valid encodings mutated (bytes overwritten, a header field set to an extreme,
//! truncated, extended) never panic, and whatever decodes re-encodes to exactly the bytes it
//! came from; valid batches round-trip. Case counts are bounded so the file runs in seconds.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use wire::{Batch, MAGIC, Phase, WireSequence};

/// Cases per property.
const CASES: u32 = 512;

/// What decoding `bytes` must give: an error, or a batch whose encoding is `bytes`.
fn decodes_faithfully(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(b) = Batch::decode(bytes) {
        let again = b.encode();
        prop_assert!(again.is_ok(), "a decoded batch does not encode: {again:?}");
        prop_assert_eq!(again.unwrap(), bytes.to_vec());
    }
    Ok(())
}

fn finite() -> impl Strategy<Value = f32> {
    prop_oneof![
        -1e6f32..1e6f32,
        Just(0.0f32),
        Just(-0.0f32),
        Just(f32::MIN_POSITIVE)
    ]
}

fn sequence() -> impl Strategy<Value = WireSequence> {
    (0usize..24).prop_flat_map(|n| {
        (
            prop::collection::vec(any::<u32>(), n),
            prop::collection::vec(any::<(bool, bool)>(), n),
            prop::collection::vec(-1i8..=3, n),
            prop::collection::vec(finite(), n),
            prop::collection::vec(finite(), 0..5),
            any::<u32>(),
            any::<i32>(),
            any::<(bool, bool)>(),
        )
            .prop_map(
                |(
                    tokens,
                    marks,
                    stages,
                    behaviour_logprobs,
                    advantages,
                    group_id,
                    pv,
                    (r, off),
                )| {
                    let loss_mask: Vec<bool> = marks.iter().map(|&(m, _)| m).collect();
                    // Unlikelihood on counted tokens only, and empty when no token has it (the
                    // one form a decode gives back).
                    let mut unlikelihood: Vec<bool> = marks.iter().map(|&(m, u)| m && u).collect();
                    if !unlikelihood.contains(&true) {
                        unlikelihood.clear();
                    }
                    WireSequence {
                        tokens,
                        loss_mask,
                        unlikelihood,
                        stages,
                        behaviour_logprobs,
                        advantages,
                        group_id,
                        policy_version: pv,
                        phase: if r { Phase::Reflection } else { Phase::Task },
                        off_policy: off,
                    }
                },
            )
    })
}

fn batch() -> impl Strategy<Value = Batch> {
    (
        any::<i32>(),
        any::<bool>(),
        prop::collection::vec(sequence(), 0..6),
    )
        .prop_map(|(policy_version, rl, seqs)| Batch {
            policy_version,
            rl,
            seqs,
        })
}

/// One change to an encoded body.
#[derive(Debug, Clone)]
enum Mutation {
    /// Overwrite the byte at this position (modulo the length).
    Byte(usize, u8),
    /// Overwrite the 4 bytes at this position (modulo the length) with a little-endian value:
    /// counts and lengths set to extremes.
    Word(usize, u32),
    /// Keep only this many bytes (modulo the length + 1).
    Truncate(usize),
    /// Append bytes.
    Extend(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let word = prop_oneof![
        Just(0u32),
        Just(1),
        Just(2),
        Just(u32::MAX),
        Just(u32::MAX / 10 + 1),
        Just(0x4000_0000),
        any::<u32>(),
    ];
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Byte(i, b)),
        (any::<usize>(), word).prop_map(|(i, w)| Mutation::Word(i, w)),
        any::<usize>().prop_map(Mutation::Truncate),
        prop::collection::vec(any::<u8>(), 1..16).prop_map(Mutation::Extend),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    match m {
        Mutation::Byte(i, b) if !bytes.is_empty() => {
            let at = i % bytes.len();
            bytes[at] = *b;
        }
        Mutation::Word(i, w) if bytes.len() >= 4 => {
            let at = i % (bytes.len() - 3);
            bytes[at..at + 4].copy_from_slice(&w.to_le_bytes());
        }
        Mutation::Truncate(n) => bytes.truncate(n % (bytes.len() + 1)),
        Mutation::Extend(more) => bytes.extend_from_slice(more),
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn arbitrary_bytes_decode_faithfully_or_fail(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        decodes_faithfully(&bytes)?;
    }

    #[test]
    fn arbitrary_bytes_after_the_magic_decode_faithfully_or_fail(
        rest in prop::collection::vec(any::<u8>(), 0..256)
    ) {
        let mut bytes = MAGIC.to_vec();
        bytes.extend(rest);
        decodes_faithfully(&bytes)?;
    }

    #[test]
    fn valid_batches_round_trip(b in batch()) {
        let bytes = b.encode().unwrap();
        prop_assert_eq!(bytes.len(), b.encoded_len());
        prop_assert_eq!(Batch::decode(&bytes).unwrap(), b);
    }

    #[test]
    fn mutated_encodings_decode_faithfully_or_fail(
        b in batch(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let mut bytes = b.encode().unwrap();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        decodes_faithfully(&bytes)?;
    }
}
