//! Chat-template parity with Python transformers: scripts/parity/chat_template.py builds a BPE
//! tokenizer directory with prompts/chat_template.jinja and renders several conversations with
//! `apply_chat_template`; our renderer must produce byte-identical text and identical token ids.
//!
//! Needs a Python with transformers (scripts/python-env.sh makes `.venv`); set ORCH_PYTHON to
//! use another interpreter. Without one this test fails and says how to get one.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test and benchmark code fails loudly"
)]

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::python::python;

use orchestrator::infra::chat::ModelTokenizer;

fn root() -> PathBuf {
    common::browser::workspace()
}

#[test]
fn renders_exactly_like_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(python())
        .arg(root().join("scripts/parity/chat_template.py"))
        .arg("--out")
        .arg(dir.path())
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "the parity script failed (run scripts/python-env.sh, or set ORCH_PYTHON to a Python with transformers):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tok = ModelTokenizer::from_dir(dir.path()).unwrap();
    let cases: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("cases.json")).unwrap())
            .unwrap();
    assert!(
        cases.len() >= 6,
        "expected the full case list, got {}",
        cases.len()
    );
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let extra = case
            .get("extra")
            .and_then(|e| e.as_object())
            .cloned()
            .unwrap_or_default();
        let text = tok
            .template()
            .render(
                &case["messages"],
                case.get("tools"),
                case["add_generation_prompt"].as_bool().unwrap(),
                &extra,
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let expected = case["expected_text"].as_str().unwrap();
        assert_eq!(
            text, expected,
            "{name}: rendering differs from transformers"
        );
        let ids = tok.encode(&text).unwrap();
        let expected_ids: Vec<u32> = serde_json::from_value(case["expected_ids"].clone()).unwrap();
        assert_eq!(
            ids, expected_ids,
            "{name}: token ids differ from transformers"
        );
        assert_eq!(
            tok.decode(&ids).unwrap(),
            text,
            "{name}: decode(encode(x)) == x"
        );
    }
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert!(im_end < tok.vocab_size() as u32);
}

#[test]
fn unknown_role_is_a_render_error_not_a_panic() {
    let t = orchestrator::infra::chat::ChatTemplate::new(
        &std::fs::read_to_string(root().join("prompts/chat_template.jinja")).unwrap(),
        vec![],
    )
    .unwrap();
    let err = t
        .render(
            &serde_json::json!([{"role": "wizard", "content": "x"}]),
            None,
            false,
            &Default::default(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("unknown role: wizard"), "{err}");
    let err = t
        .render(
            &serde_json::json!([{"role": "user", "content": "x"}, {"role": "system", "content": "late"}]),
            None,
            false,
            &Default::default(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("first message"), "{err}");
}
