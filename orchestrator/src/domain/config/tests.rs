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

/// The presets that run the papers' recipes as written: every one but `guided`, whose
/// departures (guidance, the positive advantages alone, the loop stop)
/// `guided_is_ablation_mini_with_its_stated_departures` checks.
fn recipe_presets() -> impl Iterator<Item = &'static str> {
    preset_names().into_iter().filter(|n| *n != "guided")
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
fn ablation_mini_runs_every_recipe_on_each_seed_from_the_smoke_world() {
    let cfg = Config::load("ablation-mini", &Overrides::default()).unwrap();
    let smoke = Config::load("smoke", &Overrides::default()).unwrap();
    assert_eq!(cfg.experiment.recipes.len(), 4);
    assert_eq!(cfg.experiment.run_seeds(), vec![17, 18]);
    assert_eq!(smoke.experiment.run_seeds(), vec![17]);
    // The same world, servers, warm start and held-out pick as smoke.
    assert_eq!(cfg.data, smoke.data);
    assert_eq!(cfg.eval, smoke.eval);
    assert_eq!(cfg.experiment.seed, smoke.experiment.seed);
    assert_eq!(cfg.trainer.settings.lr, 5e-5);
    assert_eq!(cfg.rollout.temperature, 0.7);
    // One cross-task bank item: two raised the warm start's budget-cut share (session 40).
    assert_eq!((cfg.reflection.top_k, smoke.reflection.top_k), (1, 2));
    assert_eq!(cfg.reflection.max_item_chars, 0);
    let ov = Overrides {
        sets: vec!["experiment.seeds=[3, 4, 3]".into()],
        ..Default::default()
    };
    let err = Config::load("smoke", &ov).unwrap_err().to_string();
    assert!(
        err.contains("experiment.seeds") && err.contains("repeats 3"),
        "{err}"
    );
}

#[test]
fn guided_is_ablation_mini_with_its_stated_departures() {
    let g = Config::load("guided", &Overrides::default()).unwrap();
    assert_eq!(recipe_presets().count(), PRESETS.len() - 1);
    // ablation-mini, changed exactly where guided.toml says it departs; nothing else differs.
    let mut want = Config::load("ablation-mini", &Overrides::default()).unwrap();
    want.experiment.name = "guided".into();
    want.experiment.description = g.experiment.description.clone();
    want.experiment.recipes = vec![Recipe::BaselineRl];
    want.experiment.steps = 84;
    want.trainer.settings.lr = 5e-4;
    want.trainer.settings.grad_checkpoint = false;
    want.rollout.repetition_detection = Some(RepetitionDetection {
        max_pattern_size: 32,
        min_pattern_size: 1,
        min_count: 16,
    });
    want.credit.negative_scale = 0.0;
    want.credit.guidance_demos = Some("runs/guided/rl-demos.jsonl".into());
    want.data.tasks = "runs/guided/world/tasks-rl6.jsonl".into();
    want.data.index = "runs/guided/index".into();
    want.data.tokenizer = "runs/guided/model-sft".into();
    want.eval.every = 24;
    let set = |name: &str, file: &str, size, n, temperature| EvalSet {
        name: name.into(),
        tasks: format!("runs/guided/world/{file}").into(),
        size,
        n,
        temperature,
        benchmark: None,
        judges: Vec::new(),
    };
    want.eval.sets = vec![
        set("unseen", "unseen-eval.jsonl", 64, None, None),
        set("held-out-t07", "heldout.jsonl", 16, Some(4), Some(0.7)),
        set("unseen-t07", "unseen-eval.jsonl", 64, Some(2), Some(0.7)),
    ];
    assert_eq!(g, want);
    assert_eq!(g.experiment.run_seeds(), vec![17, 18]);
    assert_eq!(g.batch_credit().negative_scale, 0.0);
    // The departures are in the stored settings (and so in the run's settings hash).
    let text = toml::to_string(&g).unwrap();
    for key in [
        "guidance_demos",
        "negative_advantage_scale",
        "repetition_detection",
    ] {
        assert!(text.contains(key), "{key}: {text}");
    }
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
        cfg.rollout.max_tokens, 2560,
        "untouched keys keep the preset"
    );
}

/// The smoke preset with `sets` as `--set` overrides.
fn smoke_with(sets: &[&str]) -> Result<Config, ConfigError> {
    Config::load(
        "smoke",
        &Overrides {
            sets: sets.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        },
    )
}

#[test]
fn eval_settings_are_validated() {
    let load = smoke_with;
    let cfg = load(&[]).unwrap();
    assert_eq!((cfg.eval.held_out, cfg.data.world_held_out), (16, 16));
    assert!(cfg.eval.enabled() && cfg.eval.initial);
    let err = load(&["eval.n=0"]).unwrap_err().to_string();
    assert_eq!(err, "`eval.n` = 0 is out of range; allowed: 1..=64");
    let err = load(&["data.index_k=0"]).unwrap_err().to_string();
    assert_eq!(err, "`data.index_k` = 0 is out of range; allowed: 1..=50");
    let err = load(&["data.world_held_out=2000000"])
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "`data.world_held_out` = 2000000 is out of range; allowed: 0..=1000000"
    );
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
    // A set's own samples and temperature (a greedy and a sampled view of one file in one run).
    let own =
        "eval.sets=[{name = \"t7\", tasks = \"t.jsonl\", size = 4, n = 4, temperature = 0.7}]";
    let s = &load(&[own]).unwrap().eval.sets[0];
    assert_eq!((s.n, s.temperature), (Some(4), Some(0.7)));
    let s = &load(&[&set("qa", 5)]).unwrap().eval.sets[0];
    assert_eq!(
        (s.n, s.temperature),
        (None, None),
        "unset: eval.n and eval.temperature"
    );
    let err = load(&["eval.sets=[{name = \"a\", tasks = \"t\", size = 1, n = 65}]"])
        .unwrap_err()
        .to_string();
    assert_eq!(err, "`eval.sets.n` = 65 is out of range; allowed: 1..=64");
    let err = load(&["eval.sets=[{name = \"a\", tasks = \"t\", size = 1, temperature = -1.0}]"])
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "`eval.sets.temperature` = -1 is out of range; allowed: 0..=2 (0 = greedy)"
    );
    let bench_n = "eval.sets=[{name = \"sq\", tasks = \"s.csv\", size = 10, benchmark = \"simpleqa\", n = 2}]";
    let err = load(&[bench_n]).unwrap_err().to_string();
    assert!(
        err.contains("eval.sets.n") && err.contains("names its benchmark"),
        "{err}"
    );
    for p in ["ablation-600", "rubricem", "drtulu"] {
        let c = Config::load(p, &Overrides::default()).unwrap();
        assert!(c.eval.enabled(), "{p} evaluates on a fixed subset");
    }
}

#[test]
fn forced_answer_budget_is_derived_unless_set_and_must_fit_the_budget() {
    let cfg = Config::load("smoke", &Overrides::default()).unwrap();
    assert_eq!(cfg.rollout.forced_answer_tokens, None);
    assert_eq!(cfg.rollout.forced_answer_budget(), 320, "2560 / 8");
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
    let err = Config::load("smoke", &set("2560")).unwrap_err().to_string();
    assert!(err.contains("rollout.forced_answer_tokens"), "{err}");
    assert!(err.contains("2560"), "{err}");
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

#[test]
fn paper_presets_state_the_papers_settings() {
    for p in ["ablation-600", "rubricem", "drtulu"] {
        let c = Config::load(p, &Overrides::default()).unwrap();
        let t = &c.trainer.settings;
        assert_eq!(t.lr, 5e-7, "{p}");
        assert_eq!(t.schedule, wire::settings::LrSchedule::Constant, "{p}");
        assert_eq!((t.adam_beta1, t.adam_beta2), (0.9, 0.95), "{p}");
        assert_eq!(t.weight_decay, 0.0, "{p}");
        assert_eq!(t.kl_beta, 0.001, "{p}");
        assert_eq!(t.kl_estimator, wire::settings::KlEstimator::Kl3, "{p}");
        assert_eq!(t.reference, wire::settings::ReferencePolicy::Initial, "{p}");
        assert_eq!((t.clip_low, t.clip_high), (0.2, 0.2), "{p}");
        assert_eq!(t.finetune, wire::settings::Finetune::Full, "{p}");
        assert_eq!(t.minibatches_per_step, 1, "{p}");
        let r = &c.rollout;
        assert_eq!((r.tasks_per_step, r.n), (32, 8), "{p}");
        assert_eq!((r.temperature, r.top_p), (1.0, 1.0), "{p}");
        assert_eq!(r.max_tool_calls, 10, "{p}");
        // No smoke defaults: the inputs are the user's to give.
        assert!(c.data.tasks.as_os_str().is_empty(), "{p}");
        assert!(c.data.index.as_os_str().is_empty(), "{p}");
        assert!(c.data.tokenizer.as_os_str().is_empty(), "{p}");
        assert_eq!(c.data.world_seed, None, "{p}");
        assert_eq!(c.judge.kind, JudgeKind::Llm, "{p}");
        assert_eq!(c.judge.max_failure_rate, 0.2, "{p}");
    }
    for p in ["ablation-600", "rubricem"] {
        let c = Config::load(p, &Overrides::default()).unwrap();
        assert_eq!(c.rollout.max_tokens, 18_432, "{p}");
        assert_eq!(c.rollout.max_prompt_tokens, Some(8_192), "{p}");
        assert_eq!(c.data.scaffold, crate::domain::scaffold::Scaffold::Rubricem);
        let x = &c.reflection;
        assert_eq!(
            (x.candidates, x.temperature, x.window, x.top_k),
            (8, 0.7, 3, 2)
        );
        // The bank embeds with a learned embedding from an endpoint, never the hash silently.
        assert_eq!(c.embeddings.model, "Qwen/Qwen3-Embedding-0.6B", "{p}");
    }
    let d = Config::load("drtulu", &Overrides::default()).unwrap();
    assert_eq!(d.data.scaffold, crate::domain::scaffold::Scaffold::Drtulu);
    assert_eq!(d.rollout.max_tokens, 16_384);
    assert_eq!(d.rollout.max_prompt_tokens, Some(2_048));
}

#[test]
fn trainer_table_parses_validates_and_refuses_unknown_keys() {
    let smoke = Config::load("smoke", &Overrides::default()).unwrap();
    // The smoke trainer keeps what `trainer serve` ran with before (a tiny full fine-tune).
    let t = &smoke.trainer.settings;
    assert_eq!((t.lr, t.kl_beta, t.adam_beta2), (2e-4, 0.0, 0.999));
    assert_eq!(t.reference, wire::settings::ReferencePolicy::None);
    let set = |kv: &str| Overrides {
        sets: vec![kv.to_string()],
        ..Default::default()
    };
    let c = Config::load("smoke", &set("trainer.minibatches_per_step=2")).unwrap();
    assert_eq!(c.trainer.settings.minibatches_per_step, 2);
    assert_ne!(
        c.trainer.settings.hash(),
        t.hash(),
        "the hash follows the settings"
    );
    let c = Config::load("smoke", &set("trainer.lora.r=8")).unwrap();
    assert_eq!(c.trainer.settings.lora.r, 8);
    let err = Config::load("smoke", &set("trainer.learning_rate=1e-5"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("learning_rate"), "{err}");
    let err = Config::load("smoke", &set("trainer.minibatches_per_step=0"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("trainer.minibatches_per_step = 0") && err.contains("1..=64"),
        "{err}"
    );
    let err = Config::load("smoke", &set("trainer.kl_beta=0.01"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("kl_beta") && err.contains("reference"),
        "{err}"
    );
    let err = Config::load("smoke", &set("judge.max_failure_rate=1.5"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("judge.max_failure_rate"), "{err}");
    // The evidence-chain Research rubrics are off unless asked for (method.md A.4.1).
    assert!(!smoke.judge.research_evidence);
    let on = Config::load("smoke", &set("judge.research_evidence=true")).unwrap();
    assert!(on.judge.research_evidence);
    assert!(on.to_toml().contains("research_evidence = true"));
    // The resolved settings are part of what `orchestrator config` prints and the snapshot.
    let toml = smoke.to_toml();
    assert!(toml.contains("minibatches_per_step = 1"), "{toml}");
    assert_eq!(smoke.snapshot()["trainer"]["lr"], 2e-4);
    let back: Config = toml::from_str(&toml).unwrap();
    assert_eq!(back.trainer, smoke.trainer);
    let back: Config = serde_json::from_value(smoke.snapshot()).unwrap();
    assert_eq!(back.trainer, smoke.trainer);
}

#[test]
fn partial_tables_merge_over_defaults_and_gaps_are_validated() {
    let set = |kv: &str| Overrides {
        sets: vec![kv.to_string()],
        ..Default::default()
    };
    // A table the preset does not write, given one key: the rest are the defaults.
    let c = Config::load("smoke", &set("retry.max_retries=1")).unwrap();
    assert_eq!(c.retry.max_retries, 1);
    assert_eq!(c.retry.min_delay_ms, RetryConfig::default().min_delay_ms);
    let c = Config::load("smoke", &set("health.probe_interval_secs=3")).unwrap();
    assert_eq!(c.health.failures_before_unhealthy, 3);
    for (kv, field) in [
        ("reflection.top_p=0", "reflection.top_p"),
        ("reflection.top_p=1.5", "reflection.top_p"),
        ("judge.usd_per_mtok_prompt=-1", "judge.usd_per_mtok_prompt"),
        (
            "judge.usd_per_mtok_completion=1e9",
            "judge.usd_per_mtok_completion",
        ),
        ("judge.max_stage_chars=0", "judge.max_stage_chars"),
        ("reflection.max_item_chars=8", "reflection.max_item_chars"),
    ] {
        let err = Config::load("smoke", &set(kv)).unwrap_err().to_string();
        assert!(err.contains(field), "{kv}: {err}");
    }
}

#[test]
fn benchmark_eval_sets_name_their_benchmark_and_gold_judges() {
    let load = smoke_with;
    let ok = "eval.sets=[{name = \"sq\", tasks = \"s.csv\", size = 10, benchmark = \"simpleqa\"}]";
    let cfg = load(&[ok]).unwrap();
    assert_eq!(cfg.eval.sets[0].benchmark.as_deref(), Some("simpleqa"));
    let unknown = "eval.sets=[{name = \"x\", tasks = \"s\", size = 1, benchmark = \"mmlu\"}]";
    let err = load(&[unknown]).unwrap_err().to_string();
    assert!(
        err.contains("eval.sets.benchmark") && err.contains("mmlu"),
        "{err}"
    );
    let no_judge =
        "eval.sets=[{name = \"hb\", tasks = \"h.jsonl\", size = 5, benchmark = \"healthbench\"}]";
    let err = load(&[no_judge]).unwrap_err().to_string();
    assert!(err.contains("eval.sets.judges"), "{err}");
    let with = "eval.sets=[{name = \"hb\", tasks = \"h.jsonl\", size = 5, benchmark = \"healthbench\", judges = [{url = \"http://127.0.0.1:9\", model = \"gold\"}]}]";
    assert_eq!(load(&[with]).unwrap().eval.sets[0].judges[0].model, "gold");
    let stray = "eval.sets=[{name = \"t\", tasks = \"t.jsonl\", size = 5, judges = [{url = \"http://x\", model = \"m\"}]}]";
    assert!(
        load(&[stray])
            .unwrap_err()
            .to_string()
            .contains("eval.sets.judges")
    );
}

#[test]
fn the_deeprubric_preset_states_its_rl_setting() {
    let c = Config::load("deeprubric", &Overrides::default()).unwrap();
    assert_eq!(c.experiment.recipes, vec![Recipe::Deeprubric]);
    let t = &c.trainer.settings;
    assert_eq!((t.lr, t.kl_beta, t.warmup_steps), (1e-6, 0.0, 0));
    assert_eq!(t.reference, wire::settings::ReferencePolicy::None);
    assert_eq!((c.rollout.n, c.rollout.tasks_per_step), (8, 64));
    assert_eq!((c.rollout.temperature, c.rollout.top_p), (1.0, 1.0));
    assert_eq!(c.rollout.max_tool_calls, 20);
    assert!(c.credit.citation);
    assert_eq!(c.experiment.steps, 140);
}

#[test]
fn tracking_section_parses_validates_refuses_unknown_keys_and_redacts() {
    let load = smoke_with;
    let off = load(&[]).unwrap();
    assert!(!off.tracking.enabled());
    assert!(
        !off.to_toml().contains("[tracking]"),
        "an unset section is not rendered"
    );
    let cfg = load(&[
        "tracking.tensorboard_dir=\"runs/tb\"",
        "tracking.mlflow_url=\"http://u:s3cret-pass@127.0.0.1:5000\"",
        "tracking.poll_secs=2",
    ])
    .unwrap();
    assert!(cfg.tracking.enabled());
    assert_eq!(
        cfg.tracking.tensorboard_dir.as_deref(),
        Some(Path::new("runs/tb"))
    );
    assert_eq!(cfg.tracking.mlflow_experiment, None);
    assert_eq!(cfg.tracking.poll_secs, 2);
    assert!(!cfg.snapshot().to_string().contains("s3cret-pass"));
    let back: Config = toml::from_str(&cfg.to_toml()).unwrap();
    assert_eq!(back.tracking, cfg.tracking);
    for (kv, field) in [
        ("tracking.mlflow_url=\"ftp://x\"", "tracking.mlflow_url"),
        ("tracking.poll_secs=0", "tracking.poll_secs"),
        (
            "tracking.mlflow_experiment=\" \"",
            "tracking.mlflow_experiment",
        ),
        ("tracking.tensorboard_dir=\"\"", "tracking.tensorboard_dir"),
        ("tracking.wandb=1", "unknown field `wandb`"),
    ] {
        let err = load(&[kv]).unwrap_err().to_string();
        assert!(err.contains(field), "{kv}: {err}");
    }
}

#[test]
fn repetition_detection_is_off_in_every_preset_set_by_override_and_checked() {
    for name in recipe_presets() {
        let c = Config::load(name, &Overrides::default()).unwrap();
        assert_eq!(c.rollout.repetition_detection, None, "{name}");
        let text = toml::to_string(&c.rollout).unwrap();
        assert!(!text.contains("repetition_detection"), "{name}: {text}");
    }
    let load = |set: &str| {
        Config::load(
            "smoke",
            &Overrides {
                sets: vec![set.into()],
                ..Default::default()
            },
        )
    };
    let c = load("rollout.repetition_detection={max_pattern_size=32,min_count=16}").unwrap();
    assert_eq!(
        c.rollout.repetition_detection,
        Some(RepetitionDetection {
            max_pattern_size: 32,
            min_pattern_size: 1,
            min_count: 16
        })
    );
    for (set, field, value) in [
        (
            "rollout.repetition_detection={max_pattern_size=0,min_count=16}",
            "rollout.repetition_detection.max_pattern_size",
            "0",
        ),
        (
            "rollout.repetition_detection={max_pattern_size=8,min_pattern_size=9,min_count=4}",
            "rollout.repetition_detection.min_pattern_size",
            "9",
        ),
        (
            "rollout.repetition_detection={max_pattern_size=8,min_count=1}",
            "rollout.repetition_detection.min_count",
            "1",
        ),
    ] {
        let err = load(set).unwrap_err().to_string();
        assert!(
            err.contains(field) && err.contains(&format!("= {value} ")),
            "{set}: {err}"
        );
    }
    let err = load("rollout.repetition_detection={max_pattern_size=8,min_count=4,window=9}")
        .unwrap_err()
        .to_string();
    assert!(err.contains("window"), "{err}");
}

#[test]
fn answer_after_loop_is_off_in_every_preset_and_needs_the_loop_stop() {
    for (name, _) in PRESETS {
        let c = Config::load(name, &Overrides::default()).unwrap();
        assert!(!c.rollout.answer_after_loop, "{name}");
        let text = toml::to_string(&c.rollout).unwrap();
        assert!(!text.contains("answer_after_loop"), "{name}: {text}");
    }
    let load = smoke_with;
    let c = load(&[
        "rollout.repetition_detection={max_pattern_size=32,min_count=16}",
        "rollout.answer_after_loop=true",
    ])
    .unwrap();
    assert!(c.rollout.answer_after_loop);
    let err = load(&["rollout.answer_after_loop=true"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rollout.answer_after_loop") && err.contains("repetition_detection"),
        "{err}"
    );
}

#[test]
fn the_loop_a_repetition_rule_stops_on_is_measured_from_the_end() {
    let rule = RepetitionDetection {
        max_pattern_size: 4,
        min_pattern_size: 1,
        min_count: 3,
    };
    // Three copies of a 2-token block after a prefix.
    assert_eq!(rule.loop_len(&[9, 8, 1, 2, 1, 2, 1, 2]), Some(6));
    // One token six times: the smallest block (1 x 3), not 2 x 3.
    assert_eq!(rule.loop_len(&[4, 5, 5, 5, 5, 5, 5]), Some(3));
    // Two copies only, a near-loop, too short, or a block longer than the largest.
    assert_eq!(rule.loop_len(&[1, 2, 1, 2]), None);
    assert_eq!(rule.loop_len(&[1, 2, 1, 2, 1, 3]), None);
    assert_eq!(rule.loop_len(&[]), None);
    assert_eq!(rule.loop_len(&[1, 2, 3, 4, 5].repeat(3)), None);
    let wide = RepetitionDetection {
        max_pattern_size: 5,
        min_pattern_size: 2,
        min_count: 3,
    };
    assert_eq!(wide.loop_len(&[1, 2, 3, 4, 5].repeat(3)), Some(15));
    // min_pattern_size 2: a run of one token is a 2-token block.
    assert_eq!(wide.loop_len(&[7; 6]), Some(6));
}

#[test]
fn overlong_filtering_is_off_in_every_preset_and_set_by_override() {
    for (name, _) in PRESETS {
        let c = Config::load(name, &Overrides::default()).unwrap();
        assert!(!c.credit.overlong_filter, "{name}");
        // Off, it is not serialised, so stored configs of earlier runs read back the same.
        let text = toml::to_string(&c.credit).unwrap();
        assert!(!text.contains("overlong_filter"), "{name}: {text}");
    }
    let ov = Overrides {
        sets: vec!["credit.overlong_filter=true".into()],
        ..Default::default()
    };
    let c = Config::load("smoke", &ov).unwrap();
    assert!(c.credit.overlong_filter);
    let bad = Overrides {
        sets: vec!["credit.overlong_filter=1".into()],
        ..Default::default()
    };
    let err = Config::load("smoke", &bad).unwrap_err().to_string();
    assert!(err.contains("overlong_filter"), "{err}");
}

#[test]
fn loop_tokens_only_is_off_in_every_preset_needs_the_loop_stop_and_excludes_the_filter() {
    for (name, _) in PRESETS {
        let c = Config::load(name, &Overrides::default()).unwrap();
        assert!(!c.credit.loop_tokens_only, "{name}");
        assert_eq!(c.cut_credit(), CutCredit::Whole, "{name}");
        let text = toml::to_string(&c.credit).unwrap();
        assert!(!text.contains("loop_tokens_only"), "{name}: {text}");
    }
    let rule = "rollout.repetition_detection={max_pattern_size=32,min_count=16}";
    let c = smoke_with(&[rule, "credit.loop_tokens_only=true"]).unwrap();
    assert_eq!(
        c.cut_credit(),
        CutCredit::LoopOnly(RepetitionDetection {
            max_pattern_size: 32,
            min_pattern_size: 1,
            min_count: 16,
        })
    );
    let c = smoke_with(&[rule, "credit.overlong_filter=true"]).unwrap();
    assert_eq!(c.cut_credit(), CutCredit::Drop);
    let c = smoke_with(&[rule]).unwrap();
    assert_eq!(c.cut_credit(), CutCredit::Whole);

    let err = smoke_with(&["credit.loop_tokens_only=true"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("credit.loop_tokens_only") && err.contains("repetition_detection"),
        "{err}"
    );
    let err = smoke_with(&[
        rule,
        "credit.loop_tokens_only=true",
        "credit.overlong_filter=true",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("credit.loop_tokens_only") && err.contains("overlong_filter"),
        "{err}"
    );
}

#[test]
fn loop_unlikelihood_is_off_in_every_preset_needs_the_loop_stop_and_excludes_the_filter() {
    for (name, _) in PRESETS {
        let c = Config::load(name, &Overrides::default()).unwrap();
        assert_eq!(c.trainer.settings.loop_unlikelihood, 0.0, "{name}");
        assert_eq!(c.trainer.settings.off_policy_shaping, 0.0, "{name}");
        assert_eq!(c.trainer.settings.entropy_bonus, 0.0, "{name}");
        assert_eq!(c.batch_credit().unlikelihood, None, "{name}");
    }
    let rule = "rollout.repetition_detection={max_pattern_size=32,min_count=16}";
    let want = RepetitionDetection {
        max_pattern_size: 32,
        min_pattern_size: 1,
        min_count: 16,
    };
    let c = smoke_with(&[rule, "trainer.loop_unlikelihood=0.5"]).unwrap();
    assert_eq!(c.trainer.settings.loop_unlikelihood, 0.5);
    assert_eq!(
        c.batch_credit(),
        BatchCredit {
            cut: CutCredit::Whole,
            unlikelihood: Some(want),
            ..BatchCredit::default()
        }
    );
    assert_eq!(c.batch_credit().loop_rule(), Some(want));
    // With the loop-only credit both use the one rule.
    let c = smoke_with(&[
        rule,
        "trainer.loop_unlikelihood=0.5",
        "credit.loop_tokens_only=true",
    ])
    .unwrap();
    assert_eq!(c.batch_credit().cut, CutCredit::LoopOnly(want));
    // The rule alone marks nothing.
    assert_eq!(
        smoke_with(&[rule]).unwrap().batch_credit().unlikelihood,
        None
    );

    let err = smoke_with(&["trainer.loop_unlikelihood=0.5"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("trainer.loop_unlikelihood")
            && err.contains("0.5 without rollout.repetition_detection"),
        "{err}"
    );
    let err = smoke_with(&[
        rule,
        "trainer.loop_unlikelihood=0.5",
        "credit.overlong_filter=true",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("trainer.loop_unlikelihood") && err.contains("overlong_filter"),
        "{err}"
    );
    let err = smoke_with(&[rule, "trainer.loop_unlikelihood=20"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("loop_unlikelihood") && err.contains("[0, 10]"),
        "{err}"
    );
}

#[test]
fn the_negative_advantage_scale_is_one_in_every_preset_unserialised_there_and_range_checked() {
    for name in recipe_presets() {
        let c = Config::load(name, &Overrides::default()).unwrap();
        assert_eq!(c.credit.negative_scale, 1.0, "{name}");
        assert_eq!(c.batch_credit().negative_scale, 1.0, "{name}");
        // Absent from the serialised table at 1, so earlier runs' stored configs read the same.
        let text = toml::to_string(&c.credit).unwrap();
        assert!(!text.contains("negative_advantage_scale"), "{name}: {text}");
    }
    let c = smoke_with(&["credit.negative_advantage_scale=0.0"]).unwrap();
    assert_eq!(c.batch_credit().negative_scale, 0.0);
    assert_eq!(
        c.batch_credit()
            .trained_advantages([1.0, -2.0, 0.0, -0.5], false),
        [1.0, 0.0, 0.0, 0.0]
    );
    let text = toml::to_string(&c.credit).unwrap();
    assert!(text.contains("negative_advantage_scale = 0.0"), "{text}");
    let back: CreditConfig = toml::from_str(&text).unwrap();
    assert_eq!(back, c.credit);
    for bad in ["1.5", "-0.1", "nan"] {
        let err = smoke_with(&[&format!("credit.negative_advantage_scale={bad}")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("credit.negative_advantage_scale") && err.contains("0..=1"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn the_reflection_negative_advantage_scale_is_one_in_every_preset_unserialised_there_and_range_checked()
 {
    for name in preset_names() {
        let c = Config::load(name, &Overrides::default()).unwrap();
        assert_eq!(c.credit.reflection_negative_scale, 1.0, "{name}");
        let text = toml::to_string(&c.credit).unwrap();
        assert!(
            !text.contains("reflection_negative_advantage_scale"),
            "{name}: {text}"
        );
    }
    let c = smoke_with(&["credit.reflection_negative_advantage_scale=0.25"]).unwrap();
    let b = c.batch_credit();
    // Its own field: the task side's scale is untouched, and the other way round.
    assert_eq!((b.negative_scale, b.reflection_negative_scale), (1.0, 0.25));
    assert_eq!(b.trained_reflection_advantage(-2.0), -0.5);
    assert_eq!(b.trained_reflection_advantage(1.5), 1.5);
    assert_eq!(b.trained_advantages([-1.0; 4], false), [-1.0; 4]);
    let task_side = smoke_with(&["credit.negative_advantage_scale=0.0"]).unwrap();
    assert_eq!(
        task_side.batch_credit().trained_reflection_advantage(-2.0),
        -2.0
    );
    let text = toml::to_string(&c.credit).unwrap();
    assert!(
        text.contains("reflection_negative_advantage_scale = 0.25"),
        "{text}"
    );
    let back: CreditConfig = toml::from_str(&text).unwrap();
    assert_eq!(back, c.credit);
    for bad in ["1.5", "-0.1", "nan"] {
        let err = smoke_with(&[&format!("credit.reflection_negative_advantage_scale={bad}")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("credit.reflection_negative_advantage_scale") && err.contains("0..=1"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn guidance_is_off_in_every_preset_unserialised_there_and_checked() {
    for name in recipe_presets() {
        let c = Config::load(name, &Overrides::default()).unwrap();
        assert_eq!(c.credit.guidance_demos, None, "{name}");
        let text = toml::to_string(&c.credit).unwrap();
        assert!(!text.contains("guidance_demos"), "{name}: {text}");
    }
    let c = smoke_with(&["credit.guidance_demos=\"runs/demos.jsonl\""]).unwrap();
    assert_eq!(c.trainer.settings.off_policy_shaping, 0.0);
    // LUFFY's shaping of the demonstrations' tokens: off in every preset, and only with them.
    let shaped = smoke_with(&[
        "credit.guidance_demos=\"runs/demos.jsonl\"",
        "trainer.off_policy_shaping=0.1",
    ])
    .unwrap();
    assert_eq!(shaped.trainer.settings.off_policy_shaping, 0.1);
    assert_ne!(shaped.trainer.settings.hash(), c.trainer.settings.hash());
    let err = smoke_with(&["trainer.off_policy_shaping=0.1"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("trainer.off_policy_shaping")
            && err.contains("0.1 without credit.guidance_demos"),
        "{err}"
    );
    let err = smoke_with(&[
        "credit.guidance_demos=\"runs/demos.jsonl\"",
        "trainer.off_policy_shaping=-1",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("off_policy_shaping") && err.contains("[0, 10]"),
        "{err}"
    );
    assert_eq!(
        c.credit.guidance_demos.as_deref(),
        Some(std::path::Path::new("runs/demos.jsonl"))
    );
    let back: CreditConfig = toml::from_str(&toml::to_string(&c.credit).unwrap()).unwrap();
    assert_eq!(back, c.credit);
    for bad in ["\"\"", "\".\""] {
        let err = smoke_with(&[&format!("credit.guidance_demos={bad}")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("credit.guidance_demos") && err.contains("demonstrations file"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn reflection_inject_is_the_curriculum_in_every_preset_unserialised_there_and_named_when_refused() {
    for name in preset_names() {
        let c = Config::load(name, &Overrides::default()).unwrap();
        assert_eq!(c.reflection.inject, Inject::Curriculum, "{name}");
        let text = toml::to_string(&c.reflection).unwrap();
        assert!(!text.contains("inject"), "{name}: {text}");
    }
    for (value, want) in [
        ("none", Inject::None),
        ("cross", Inject::Cross),
        ("within", Inject::Within),
        ("curriculum", Inject::Curriculum),
    ] {
        let c = smoke_with(&[&format!("reflection.inject={value}")]).unwrap();
        assert_eq!(c.reflection.inject, want, "{value}");
        let back: ReflectionConfig =
            toml::from_str(&toml::to_string(&c.reflection).unwrap()).unwrap();
        assert_eq!(back, c.reflection, "{value}");
    }
    let err = smoke_with(&["reflection.inject=both"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("inject") && err.contains("both"),
        "the refusal names the key and the value: {err}"
    );
}

#[test]
fn the_loop_negative_advantage_scale_is_absent_in_every_preset_and_checked() {
    for name in preset_names() {
        let c = Config::load(name, &Overrides::default()).unwrap();
        assert_eq!(c.credit.loop_negative_scale, None, "{name}");
        let text = toml::to_string(&c.credit).unwrap();
        assert!(
            !text.contains("loop_negative_advantage_scale"),
            "{name}: {text}"
        );
    }
    let loops = "rollout.repetition_detection={max_pattern_size=32,min_count=16}";
    let c = smoke_with(&[
        loops,
        "credit.negative_advantage_scale=0.0",
        "credit.loop_negative_advantage_scale=0.25",
    ])
    .unwrap();
    let b = c.batch_credit();
    assert_eq!((b.negative_scale, b.loop_negative_scale), (0.0, Some(0.25)));
    // A loop-stopped attempt's negatives take the loop scale, every other attempt's the
    // task side's; positive advantages are kept either way.
    assert_eq!(
        b.trained_advantages([1.0, -2.0, 0.0, -0.5], true),
        [1.0, -0.5, 0.0, -0.125]
    );
    assert_eq!(
        b.trained_advantages([1.0, -2.0, 0.0, -0.5], false),
        [1.0, 0.0, 0.0, 0.0]
    );
    let text = toml::to_string(&c.credit).unwrap();
    assert!(
        text.contains("loop_negative_advantage_scale = 0.25"),
        "{text}"
    );
    let back: CreditConfig = toml::from_str(&text).unwrap();
    assert_eq!(back, c.credit);
    for bad in ["1.5", "-0.1", "nan"] {
        let err = smoke_with(&[
            loops,
            &format!("credit.loop_negative_advantage_scale={bad}"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("credit.loop_negative_advantage_scale") && err.contains("0..=1"),
            "{bad}: {err}"
        );
    }
    // Without the loop stop there is no loop-stopped attempt to scale: refused, by name.
    let err = smoke_with(&["credit.loop_negative_advantage_scale=0.25"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("credit.loop_negative_advantage_scale")
            && err.contains("rollout.repetition_detection"),
        "{err}"
    );
}

#[test]
fn the_entropy_bonus_is_off_in_every_preset_set_by_override_and_bounded() {
    let plain = smoke_with(&[]).unwrap();
    let on = smoke_with(&["trainer.entropy_bonus=0.1"]).unwrap();
    assert_eq!(on.trainer.settings.entropy_bonus, 0.1);
    // Off, it is not serialised, so every earlier run's settings hash stands.
    assert_ne!(on.trainer.settings.hash(), plain.trainer.settings.hash());
    let text = serde_json::to_string(&plain.trainer.settings).unwrap();
    assert!(!text.contains("entropy_bonus"), "{text}");
    for bad in ["-0.1", "1.5"] {
        let err = smoke_with(&[&format!("trainer.entropy_bonus={bad}")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("trainer.entropy_bonus") && err.contains("[0, 1]"),
            "{err}"
        );
    }
}
