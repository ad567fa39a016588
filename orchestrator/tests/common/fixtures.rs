//! Hand-built trajectory pieces shared by database tests.
#![allow(dead_code)]

use orchestrator::domain::trajectory::{Segment, SegmentKind, Stage};

/// A stored segment of `text` in the fake's toy tokenisation; model segments get logprobs and
/// policy version 0.
pub fn segment(kind: SegmentKind, stage: Option<Stage>, text: &str) -> Segment {
    let ids = super::fake_openai::toy_tokenize(text);
    let model = kind == SegmentKind::Model;
    Segment {
        kind,
        stage,
        logprobs: model.then(|| vec![-0.1; ids.len()]),
        token_ids: ids,
        text: text.into(),
        policy_version: model.then_some(0),
    }
}
