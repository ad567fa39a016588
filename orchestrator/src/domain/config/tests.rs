//! Unit tests of configuration loading, precedence and validation.

use super::*;

#[test]
fn recipe_names_parse_back_as_serde_writes_them() {
    for r in Recipe::ALL {
        assert_eq!(Recipe::parse(r.as_str()), Some(r));
        assert_eq!(
            serde_json::to_value(r).unwrap(),
            serde_json::Value::String(r.as_str().into())
        );
    }
    assert_eq!(Recipe::parse("rollout"), None);
}

#[test]
fn every_preset_loads_and_validates() {
    for name in preset_names() {
        let cfg = Config::load(name, &Overrides::default()).unwrap();
        assert_eq!(cfg.experiment.name, name);
    }
}

#[test]
fn ablation_has_the_four_recipes() {
    let cfg = Config::load("ablation-600", &Overrides::default()).unwrap();
    assert_eq!(
        cfg.experiment.recipes,
        vec![
            Recipe::BaselineRl,
            Recipe::SsGrpo,
            Recipe::MetaPolicy,
            Recipe::Full
        ]
    );
    assert_eq!(cfg.experiment.steps, 600);
    assert_eq!(cfg.rollout.n * cfg.rollout.tasks_per_step, 256);
}

#[test]
fn precedence_preset_file_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("o.toml");
    std::fs::write(&file, "[rollout]\nn = 2\ntemperature = 0.5\n").unwrap();
    let ov = Overrides {
        file: Some(file),
        sets: vec!["rollout.n=6".into(), "judge.model=\"g\"".into()],
        steps: Some(3),
        policy_urls: Some(vec!["http://a:1".into(), "http://b:2".into()]),
        ..Default::default()
    };
    let cfg = Config::load("smoke", &ov).unwrap();
    assert_eq!(cfg.rollout.n, 6, "--set beats the file");
    assert_eq!(cfg.rollout.temperature, 0.5, "the file beats the preset");
    assert_eq!(cfg.experiment.steps, 3);
    assert_eq!(cfg.judge.model, "g");
    assert_eq!(cfg.policy.urls, vec!["http://a:1", "http://b:2"]);
    assert_eq!(
        cfg.rollout.max_tokens, 512,
        "untouched keys keep the preset"
    );
}

#[test]
fn eval_settings_are_validated() {
    let load = |sets: &[&str]| {
        Config::load(
            "smoke",
            &Overrides {
                sets: sets.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
        )
    };
    let cfg = load(&[]).unwrap();
    assert_eq!(cfg.eval.held_out, 8);
    assert!(cfg.eval.enabled() && cfg.eval.initial);
    let err = load(&["eval.n=0"]).unwrap_err().to_string();
    assert_eq!(err, "`eval.n` = 0 is out of range; allowed: 1..=64");
    let err = load(&["eval.temperature=2.5"]).unwrap_err().to_string();
    assert_eq!(
        err,
        "`eval.temperature` = 2.5 is out of range; allowed: 0..=2 (0 = greedy)"
    );
    assert_eq!(
        load(&["eval.temperature=0"]).unwrap().eval.temperature,
        Some(0.0)
    );
    let set = |name: &str, size: u32| {
        format!("eval.sets=[{{name = \"{name}\", tasks = \"t.jsonl\", size = {size}}}]")
    };
    assert_eq!(
        load(&[&set("hotpotqa", 100)]).unwrap().eval.sets[0].size,
        100
    );
    let err = load(&[&set("held-out", 5)]).unwrap_err().to_string();
    assert!(err.starts_with("`eval.sets.name` = \"held-out\""), "{err}");
    let err = load(&[&set("a b", 5)]).unwrap_err().to_string();
    assert!(err.contains("letters, digits"), "{err}");
    let err = load(&[&set("qa", 0)]).unwrap_err().to_string();
    assert_eq!(
        err,
        "`eval.sets.size` = 0 is out of range; allowed: 1..=1000000"
    );
    let two = "eval.sets=[{name = \"qa\", tasks = \"a\", size = 1}, {name = \"qa\", tasks = \"b\", size = 1}]";
    let err = load(&[two]).unwrap_err().to_string();
    assert!(err.contains("used by one set only"), "{err}");
    for p in ["ablation-600", "rubricem", "drtulu"] {
        let c = Config::load(p, &Overrides::default()).unwrap();
        assert!(c.eval.enabled(), "{p} evaluates on a fixed subset");
    }
}

#[test]
fn forced_answer_budget_is_derived_unless_set_and_must_fit_the_budget() {
    let cfg = Config::load("smoke", &Overrides::default()).unwrap();
    assert_eq!(cfg.rollout.forced_answer_tokens, None);
    assert_eq!(cfg.rollout.forced_answer_budget(), 64, "512 / 8");
    assert!(
        !cfg.to_toml().contains("forced_answer_tokens"),
        "unset is not written"
    );
    let set = |v: &str| Overrides {
        sets: vec![format!("rollout.forced_answer_tokens={v}")],
        ..Default::default()
    };
    let cfg = Config::load("smoke", &set("100")).unwrap();
    assert_eq!(cfg.rollout.forced_answer_budget(), 100);
    let err = Config::load("smoke", &set("512")).unwrap_err().to_string();
    assert!(err.contains("rollout.forced_answer_tokens"), "{err}");
    assert!(err.contains("512"), "{err}");
}

#[test]
fn unknown_key_is_an_error_naming_it() {
    let ov = Overrides {
        sets: vec!["rollout.nn=3".into()],
        ..Default::default()
    };
    let err = Config::load("smoke", &ov).unwrap_err().to_string();
    assert!(err.contains("unknown field `nn`"), "{err}");
    let ov = Overrides {
        sets: vec!["bogus.x=1".into()],
        ..Default::default()
    };
    let err = Config::load("smoke", &ov).unwrap_err().to_string();
    assert!(err.contains("bogus"), "{err}");
}

#[test]
fn out_of_range_names_field_value_and_limit() {
    let ov = Overrides {
        sets: vec!["rollout.n=0".into()],
        ..Default::default()
    };
    let err = Config::load("smoke", &ov).unwrap_err().to_string();
    assert_eq!(err, "`rollout.n` = 0 is out of range; allowed: 1..=64");
    let ov = Overrides {
        sets: vec!["rollout.temperature=3.5".into()],
        ..Default::default()
    };
    let err = Config::load("smoke", &ov).unwrap_err().to_string();
    assert!(
        err.contains("rollout.temperature") && err.contains("3.5"),
        "{err}"
    );
    let ov = Overrides {
        policy_urls: Some(vec!["ftp://x".into()]),
        ..Default::default()
    };
    let err = Config::load("smoke", &ov).unwrap_err().to_string();
    assert!(
        err.contains("policy.urls") && err.contains("ftp://x"),
        "{err}"
    );
}

#[test]
fn bad_enum_lists_allowed_values() {
    let ov = Overrides {
        sets: vec!["judge.kind=\"oracle\"".into()],
        ..Default::default()
    };
    let err = Config::load("smoke", &ov).unwrap_err().to_string();
    assert!(err.contains("oracle") && err.contains("lexical"), "{err}");
    let ov = Overrides {
        sets: vec!["experiment.recipes=[\"ppo\"]".into()],
        ..Default::default()
    };
    let err = Config::load("smoke", &ov).unwrap_err().to_string();
    assert!(err.contains("ppo") && err.contains("baseline-rl"), "{err}");
}

#[test]
fn unknown_preset_lists_presets() {
    let err = Config::load("nope", &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nope") && err.contains("ablation-600"),
        "{err}"
    );
}

#[test]
fn malformed_override_is_rejected() {
    for bad in ["rollout.n", "=3", "rollout..n=3"] {
        let ov = Overrides {
            sets: vec![bad.into()],
            ..Default::default()
        };
        assert!(Config::load("smoke", &ov).is_err(), "{bad}");
    }
    let ov = Overrides {
        sets: vec!["rollout.n.x=3".into()],
        ..Default::default()
    };
    let err = Config::load("smoke", &ov).unwrap_err().to_string();
    assert!(err.contains("`n` is a value"), "{err}");
}

#[test]
fn snapshot_redacts_password() {
    let ov = Overrides {
        database_url: Some("postgres://u:hunter2@h:5432/db".into()),
        ..Default::default()
    };
    let cfg = Config::load("smoke", &ov).unwrap();
    let snap = cfg.snapshot().to_string();
    assert!(!snap.contains("hunter2"), "{snap}");
}
