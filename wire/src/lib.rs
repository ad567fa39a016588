//! The train batch on the wire: what the orchestrator sends `trainer serve` each step. JSON is
//! too big at 256 x 18k tokens, so the body is a compact little-endian layout, validated on
//! decode with errors naming the sequence and field:
//!
//! ```text
//! header   b"RBEMBAT1" | u32 n_seqs | i32 policy_version | u32 flags (bit 0: RL, else SFT)
//! n_seqs x u32 len | u32 group_id | i32 policy_version | u16 n_adv
//!          | u16 phase (low byte: 0 task, 1 reflection; bit 8: off-policy)
//! n_seqs x tokens u32[len] | stages i8[len] | loss_mask u8[len] (0/1/2)
//!          | behaviour_logprobs f32[len] | advantages f32[n_adv]
//! ```
//!
//! 10 bytes per token: a 256 x 16k batch is 42 MB. A loss-mask byte 2 is a counted token that
//! the unlikelihood term also pushes down (a repeated copy of a loop; `unlikelihood`). Bit 8 of
//! a sequence's phase word marks a sequence no policy server sampled (`off_policy`).
//!
//! A train step applies the reflection sequences (phase 1, the meta-policy's deferred batch,
//! method.md A.6.3) as their own optimizer step first (Phase A), then the task sequences
//! (Phase B).
//!
//! The rest of the trainer HTTP API is JSON, typed in [`api`] (replies, requests, the error
//! body); [`PolicyVersion`] is the policy version both sides count in; [`repetition`] is the
//! loop rule both sides apply (vLLM's `repetition_detection`).

pub mod api;
mod policy_version;
pub mod repetition;
pub mod settings;
pub mod token;

pub use api::{
    CheckpointReply, CheckpointRequest, DryRunReply, ErrorBody, ErrorDetail, Published,
    RestoreReply, RestoreRequest, StateReply, StepMetrics, TrainMode, TrainReply,
};
pub use policy_version::PolicyVersion;
pub use settings::{SettingsReply, TrainSettings};

pub const MAGIC: &[u8; 8] = b"RBEMBAT1";
const HEADER: usize = 8 + 4 + 4 + 4;
const SEQ_HEADER: usize = 4 + 4 + 4 + 2 + 2;

/// Which optimizer step of a train request a sequence belongs to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Phase {
    /// Phase B: the step's task trajectories.
    #[default]
    Task,
    /// Phase A: reflection candidates of an earlier step (trained first).
    Reflection,
}

/// Bit of a sequence header's phase word that marks an off-policy sequence.
const OFF_POLICY_BIT: u16 = 0x100;

impl Phase {
    fn code(self) -> u16 {
        match self {
            Phase::Task => 0,
            Phase::Reflection => 1,
        }
    }
}

/// One sequence of a train batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WireSequence {
    pub tokens: Vec<u32>,
    /// Token t counts in the loss (model tokens only).
    pub loss_mask: Vec<bool>,
    /// Token t (a counted one) also carries the unlikelihood term −log(1 − p): a repeated copy
    /// of the loop a loop-stopped attempt ended in (`trainer.loop_unlikelihood`). Empty when no
    /// token does; otherwise one entry per token. On the wire, loss-mask byte 2.
    pub unlikelihood: Vec<bool>,
    /// Stage of token t (0..=3), or -1.
    pub stages: Vec<i8>,
    /// Behaviour log-prob of token t from the inference server (0 where not generated).
    pub behaviour_logprobs: Vec<f32>,
    /// Per-stage advantages (SS-GRPO), one value (GRPO), or none (SFT).
    pub advantages: Vec<f32>,
    /// The GRPO group (task) the sequence belongs to.
    pub group_id: u32,
    /// Policy version that sampled it (staleness accounting).
    pub policy_version: i32,
    pub phase: Phase,
    /// No policy server sampled it: a demonstration replayed into its group
    /// (`credit.guidance_demos`), whose tokens carry behaviour log-prob 0. With
    /// `trainer.off_policy_shaping` its tokens take the shaped objective instead of the ratio.
    /// On the wire, bit 8 of the phase word.
    pub off_policy: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// Policy version the batch was built against.
    pub policy_version: i32,
    /// RL step (else SFT).
    pub rl: bool,
    pub seqs: Vec<WireSequence>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    #[error("body of {len} bytes is shorter than the {HEADER}-byte header")]
    Short { len: usize },
    #[error("bad magic {found:?}; expected {MAGIC:?} (is the sender a different version?)")]
    Magic { found: Vec<u8> },
    #[error("sequence {seq}: {what}")]
    Seq { seq: usize, what: String },
    #[error("body is {len} bytes; the headers describe {expected}")]
    Length { len: usize, expected: usize },
    #[error("flags {0:#x} carry unknown bits; allowed: 0x1")]
    Flags(u32),
}

impl Batch {
    /// Encoded size in bytes.
    pub fn encoded_len(&self) -> usize {
        HEADER
            + self
                .seqs
                .iter()
                .map(|s| SEQ_HEADER + s.tokens.len() * 10 + s.advantages.len() * 4)
                .sum::<usize>()
    }

    /// Encode; fails if a sequence's per-token arrays disagree in length.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        for (i, s) in self.seqs.iter().enumerate() {
            let n = s.tokens.len();
            for (what, len) in [
                ("loss_mask", s.loss_mask.len()),
                ("stages", s.stages.len()),
                ("behaviour_logprobs", s.behaviour_logprobs.len()),
            ] {
                if len != n {
                    return Err(WireError::Seq {
                        seq: i,
                        what: format!("{what} has {len} entries for {n} tokens"),
                    });
                }
            }
            if !s.unlikelihood.is_empty() {
                if s.unlikelihood.len() != n {
                    return Err(WireError::Seq {
                        seq: i,
                        what: format!(
                            "unlikelihood has {} entries for {n} tokens (or none)",
                            s.unlikelihood.len()
                        ),
                    });
                }
                if let Some(t) = (0..n).find(|&t| s.unlikelihood[t] && !s.loss_mask[t]) {
                    return Err(WireError::Seq {
                        seq: i,
                        what: format!("token {t} carries unlikelihood but not the loss mask"),
                    });
                }
            }
            if n > u32::MAX as usize || s.advantages.len() > u16::MAX as usize {
                return Err(WireError::Seq {
                    seq: i,
                    what: format!(
                        "{n} tokens / {} advantages exceed the format's limits (u32 / u16)",
                        s.advantages.len()
                    ),
                });
            }
        }
        let mut out = Vec::with_capacity(self.encoded_len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.seqs.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.policy_version.to_le_bytes());
        out.extend_from_slice(&u32::from(self.rl).to_le_bytes());
        for s in &self.seqs {
            out.extend_from_slice(&(s.tokens.len() as u32).to_le_bytes());
            out.extend_from_slice(&s.group_id.to_le_bytes());
            out.extend_from_slice(&s.policy_version.to_le_bytes());
            out.extend_from_slice(&(s.advantages.len() as u16).to_le_bytes());
            let word = s.phase.code() | if s.off_policy { OFF_POLICY_BIT } else { 0 };
            out.extend_from_slice(&word.to_le_bytes());
        }
        for s in &self.seqs {
            for t in &s.tokens {
                out.extend_from_slice(&t.to_le_bytes());
            }
            out.extend(s.stages.iter().map(|&k| k as u8));
            if s.unlikelihood.is_empty() {
                out.extend(s.loss_mask.iter().map(|&m| u8::from(m)));
            } else {
                out.extend(
                    s.loss_mask
                        .iter()
                        .zip(&s.unlikelihood)
                        .map(|(&m, &u)| u8::from(m) + u8::from(u)),
                );
            }
            for x in &s.behaviour_logprobs {
                out.extend_from_slice(&x.to_le_bytes());
            }
            for x in &s.advantages {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        Ok(out)
    }

    /// Decode and validate (lengths, mask bytes 0/1/2, stages -1..=3, finite floats). Never
    /// panics: any body either decodes to the batch whose encoding it is, byte for byte, or is
    /// an error (`tests/decode.rs` checks both on arbitrary and mutated bodies).
    pub fn decode(body: &[u8]) -> Result<Batch, WireError> {
        if body.len() < HEADER {
            return Err(WireError::Short { len: body.len() });
        }
        if &body[..8] != MAGIC {
            return Err(WireError::Magic {
                found: body[..8].to_vec(),
            });
        }
        let u32_at =
            |p: usize| u32::from_le_bytes([body[p], body[p + 1], body[p + 2], body[p + 3]]);
        let n = u32_at(8) as usize;
        let policy_version = u32_at(12) as i32;
        let flags = u32_at(16);
        if flags & !1 != 0 {
            return Err(WireError::Flags(flags));
        }
        let heads_end = HEADER.saturating_add(n.saturating_mul(SEQ_HEADER));
        if heads_end > body.len() {
            return Err(WireError::Length {
                len: body.len(),
                expected: heads_end,
            });
        }
        let mut heads = Vec::with_capacity(n);
        let mut expected = heads_end;
        for i in 0..n {
            let p = HEADER + i * SEQ_HEADER;
            let len = u32_at(p) as usize;
            let n_adv = u16::from_le_bytes([body[p + 12], body[p + 13]]) as usize;
            let word = u16::from_le_bytes([body[p + 14], body[p + 15]]);
            let phase = match word & !OFF_POLICY_BIT {
                0 => Phase::Task,
                1 => Phase::Reflection,
                _ => {
                    return Err(WireError::Seq {
                        seq: i,
                        what: format!(
                            "phase word {word:#x}; allowed: 0 (task) or 1 (reflection), with \
                             bit 8 (0x100, off-policy) set or not"
                        ),
                    });
                }
            };
            let off_policy = word & OFF_POLICY_BIT != 0;
            heads.push((
                len,
                u32_at(p + 4),
                u32_at(p + 8) as i32,
                n_adv,
                phase,
                off_policy,
            ));
            expected = expected
                .saturating_add(len.saturating_mul(10))
                .saturating_add(n_adv.saturating_mul(4));
        }
        if expected != body.len() {
            return Err(WireError::Length {
                len: body.len(),
                expected,
            });
        }
        let f32s = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let mut p = heads_end;
        let mut seqs = Vec::with_capacity(n);
        for (i, (len, group_id, pv, n_adv, phase, off_policy)) in heads.into_iter().enumerate() {
            let bad = |what: String| WireError::Seq { seq: i, what };
            let tokens: Vec<u32> = body[p..p + 4 * len]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            p += 4 * len;
            let stages: Vec<i8> = body[p..p + len].iter().map(|&b| b as i8).collect();
            if let Some((t, k)) = stages
                .iter()
                .enumerate()
                .find(|(_, k)| !(-1..=3).contains(*k))
            {
                return Err(bad(format!("stage {k} at token {t}; allowed: -1..=3")));
            }
            p += len;
            let mut loss_mask = Vec::with_capacity(len);
            for (t, &b) in body[p..p + len].iter().enumerate() {
                match b {
                    0 => loss_mask.push(false),
                    1 | 2 => loss_mask.push(true),
                    _ => {
                        return Err(bad(format!(
                            "loss mask byte {b} at token {t}; allowed: 0, 1, 2 (counted, with \
                             unlikelihood)"
                        )));
                    }
                }
            }
            let unlikelihood: Vec<bool> = if body[p..p + len].contains(&2) {
                body[p..p + len].iter().map(|&b| b == 2).collect()
            } else {
                Vec::new()
            };
            p += len;
            let behaviour_logprobs = f32s(&body[p..p + 4 * len]);
            p += 4 * len;
            let advantages = f32s(&body[p..p + 4 * n_adv]);
            p += 4 * n_adv;
            if let Some(x) = behaviour_logprobs
                .iter()
                .chain(&advantages)
                .find(|x| !x.is_finite())
            {
                return Err(bad(format!(
                    "non-finite value {x} in logprobs or advantages"
                )));
            }
            seqs.push(WireSequence {
                tokens,
                loss_mask,
                unlikelihood,
                stages,
                behaviour_logprobs,
                advantages,
                group_id,
                policy_version: pv,
                phase,
                off_policy,
            });
        }
        Ok(Batch {
            policy_version,
            rl: flags & 1 == 1,
            seqs,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sample() -> Batch {
        Batch {
            policy_version: 7,
            rl: true,
            seqs: vec![
                WireSequence {
                    tokens: vec![1, 2, 3, 70000],
                    loss_mask: vec![false, true, true, false],
                    unlikelihood: vec![false, false, true, false],
                    stages: vec![-1, 0, 3, -1],
                    behaviour_logprobs: vec![0.0, -0.5, -1.25, 0.0],
                    advantages: vec![0.5, -1.0, 0.0, 2.0],
                    group_id: 3,
                    policy_version: 6,
                    phase: Phase::Task,
                    off_policy: true,
                },
                WireSequence {
                    tokens: vec![9, 8],
                    loss_mask: vec![false, true],
                    unlikelihood: vec![],
                    stages: vec![-1, 1],
                    behaviour_logprobs: vec![0.0, -2.0],
                    advantages: vec![],
                    group_id: 4,
                    policy_version: 7,
                    phase: Phase::Reflection,
                    off_policy: false,
                },
            ],
        }
    }

    #[test]
    fn round_trips_exactly() {
        let b = sample();
        let bytes = b.encode().unwrap();
        assert_eq!(bytes.len(), b.encoded_len());
        assert_eq!(Batch::decode(&bytes).unwrap(), b);
    }

    #[test]
    fn corrupt_bodies_are_named() {
        let bytes = sample().encode().unwrap();
        assert!(matches!(
            Batch::decode(&bytes[..10]),
            Err(WireError::Short { .. })
        ));
        let mut m = bytes.clone();
        m[0] = b'X';
        assert!(matches!(Batch::decode(&m), Err(WireError::Magic { .. })));
        assert!(matches!(
            Batch::decode(&bytes[..bytes.len() - 1]),
            Err(WireError::Length { .. })
        ));
        // First sequence's stages start after the headers and its 4 tokens.
        let stage_at = HEADER + 2 * SEQ_HEADER + 16;
        let mut s = bytes.clone();
        s[stage_at] = 9;
        let e = Batch::decode(&s).unwrap_err().to_string();
        assert!(e.contains("sequence 0") && e.contains("stage 9"), "{e}");
        let mut k = bytes.clone();
        k[stage_at + 4] = 3;
        let e = Batch::decode(&k).unwrap_err().to_string();
        assert!(e.contains("loss mask byte 3"), "{e}");
        // Byte 2 is a counted token with the unlikelihood term: token 1 gains it.
        let mut u = bytes.clone();
        u[stage_at + 4 + 1] = 2;
        let d = Batch::decode(&u).unwrap();
        assert_eq!(d.seqs[0].loss_mask, vec![false, true, true, false]);
        assert_eq!(d.seqs[0].unlikelihood, vec![false, true, true, false]);
        // The second sequence's phase field (last 2 bytes of its header).
        let mut ph = bytes.clone();
        ph[HEADER + 2 * SEQ_HEADER - 2] = 5;
        let e = Batch::decode(&ph).unwrap_err().to_string();
        assert!(
            e.contains("sequence 1") && e.contains("phase word 0x5"),
            "{e}"
        );
        // Bit 8 of the phase word is the off-policy mark (the first sequence carries it); any
        // other high bit is refused.
        assert_eq!(bytes[HEADER + SEQ_HEADER - 1], 1);
        let mut off = bytes.clone();
        off[HEADER + 2 * SEQ_HEADER - 1] = 1;
        let d = Batch::decode(&off).unwrap();
        assert!(d.seqs[1].off_policy && d.seqs[1].phase == Phase::Reflection);
        off[HEADER + 2 * SEQ_HEADER - 1] = 3;
        let e = Batch::decode(&off).unwrap_err().to_string();
        assert!(
            e.contains("sequence 1") && e.contains("phase word 0x301"),
            "{e}"
        );
        let mut off = sample();
        off.seqs[0].unlikelihood[0] = true;
        let e = off.encode().unwrap_err().to_string();
        assert!(
            e.contains("token 0 carries unlikelihood but not the loss mask"),
            "{e}"
        );
        off.seqs[0].unlikelihood.pop();
        let e = off.encode().unwrap_err().to_string();
        assert!(e.contains("unlikelihood has 3 entries for 4 tokens"), "{e}");
        let mut bad = sample();
        bad.seqs[1].stages.pop();
        assert!(
            bad.encode()
                .unwrap_err()
                .to_string()
                .contains("stages has 1 entries")
        );
    }
}
