//! Validation of a loaded configuration: every out-of-range value is refused with an error that
//! names the field, the value and what is allowed.

use super::{Config, ConfigError, EndpointPoolConfig, HELD_OUT, JudgeKind};

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let e = &self.experiment;
        check(
            !e.name.trim().is_empty(),
            "experiment.name",
            "\"\"",
            "a non-empty name",
        )?;
        check(
            !e.recipes.is_empty(),
            "experiment.recipes",
            "[]",
            "one or more of baseline-rl, ss-grpo, meta-policy, full, drtulu",
        )?;
        check(
            e.steps >= 1 && e.steps <= 1_000_000,
            "experiment.steps",
            e.steps,
            "1..=1000000",
        )?;
        let mut seen = std::collections::BTreeSet::new();
        if let Some(dup) = e.seeds.iter().find(|s| !seen.insert(**s)) {
            check(
                false,
                "experiment.seeds",
                format!("{:?} (repeats {dup})", e.seeds),
                "distinct seeds (or []: one run per recipe on experiment.seed)",
            )?;
        }
        check(
            e.seeds.len() <= 64,
            "experiment.seeds",
            format!("{} seeds", e.seeds.len()),
            "at most 64",
        )?;
        if let Some(m) = self.rollout.max_prompt_tokens {
            check(
                (16..=1_048_576).contains(&m),
                "rollout.max_prompt_tokens",
                m,
                "16..=1048576 (or unset: no limit)",
            )?;
        }
        check(
            (0.0..=1.0).contains(&self.judge.max_failure_rate),
            "judge.max_failure_rate",
            self.judge.max_failure_rate,
            "0..=1 (0: pause on any failed scoring call)",
        )?;
        check(
            ["google_search", "snippet_search"].contains(&self.data.index_tool.as_str()),
            "data.index_tool",
            format!("{:?}", self.data.index_tool),
            "google_search or snippet_search",
        )?;
        self.trainer
            .settings
            .validate()
            .map_err(|e| ConfigError::Schema(e.to_string()))?;
        let p = &self.pipeline;
        check(
            p.max_staleness <= 16,
            "pipeline.max_staleness",
            p.max_staleness,
            "0..=16 (0 = sequential)",
        )?;
        check(
            (1..=4096).contains(&p.max_inflight),
            "pipeline.max_inflight",
            p.max_inflight,
            "1..=4096",
        )?;
        check(
            (1..=86_400).contains(&p.trainer_wait_secs),
            "pipeline.trainer_wait_secs",
            p.trainer_wait_secs,
            "1..=86400",
        )?;
        check(
            !p.checkpoint_subdir.is_empty()
                && p.checkpoint_subdir
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c)),
            "pipeline.checkpoint_subdir",
            format!("{:?}", p.checkpoint_subdir),
            "a plain name of letters, digits, '-' and '_'",
        )?;
        let r = &self.reflection;
        check(
            (1..=64).contains(&r.candidates),
            "reflection.candidates",
            r.candidates,
            "1..=64",
        )?;
        check(
            r.temperature.is_finite() && (0.0..=2.0).contains(&r.temperature),
            "reflection.temperature",
            r.temperature,
            "0..=2",
        )?;
        check(
            (16..=32_768).contains(&r.max_tokens),
            "reflection.max_tokens",
            r.max_tokens,
            "16..=32768",
        )?;
        check(
            r.top_p.is_finite() && r.top_p > 0.0 && r.top_p <= 1.0,
            "reflection.top_p",
            r.top_p,
            "(0, 1]",
        )?;
        check(
            (0.0..=1.0).contains(&r.accept_threshold),
            "reflection.accept_threshold",
            r.accept_threshold,
            "0..=1",
        )?;
        check(
            (1..=16).contains(&r.top_k),
            "reflection.top_k",
            r.top_k,
            "1..=16",
        )?;
        check(
            (1..=1000).contains(&r.window),
            "reflection.window",
            r.window,
            "1..=1000",
        )?;
        check(
            r.max_item_chars == 0 || (16..=100_000).contains(&r.max_item_chars),
            "reflection.max_item_chars",
            r.max_item_chars,
            "0 (whole items) or 16..=100000",
        )?;
        check(
            (4..=10_000_000).contains(&self.data.world_docs),
            "data.world_docs",
            self.data.world_docs,
            "4..=10000000",
        )?;
        check(
            (1..=1_000_000).contains(&self.data.world_tasks),
            "data.world_tasks",
            self.data.world_tasks,
            "1..=1000000",
        )?;
        check(
            (1..=50).contains(&self.data.index_k),
            "data.index_k",
            self.data.index_k,
            "1..=50",
        )?;
        check(
            self.data.world_held_out <= 1_000_000,
            "data.world_held_out",
            self.data.world_held_out,
            "0..=1000000",
        )?;
        check(
            !self.database.url.is_empty(),
            "database.url",
            "\"\"",
            "a postgres:// URL",
        )?;
        check(
            (1..=1024).contains(&self.database.max_connections),
            "database.max_connections",
            self.database.max_connections,
            "1..=1024",
        )?;
        validate_pool("policy", &self.policy, true)?;
        validate_pool(
            "judge",
            &self.judge.pool(),
            self.judge.kind == JudgeKind::Llm,
        )?;
        validate_pool("embeddings", &self.embeddings, false)?;
        validate_url("trainer.url", &self.trainer.url)?;
        let j = &self.judge;
        check(
            j.usd_per_mtok_prompt.is_finite() && (0.0..=10_000.0).contains(&j.usd_per_mtok_prompt),
            "judge.usd_per_mtok_prompt",
            j.usd_per_mtok_prompt,
            "0..=10000",
        )?;
        check(
            j.usd_per_mtok_completion.is_finite()
                && (0.0..=10_000.0).contains(&j.usd_per_mtok_completion),
            "judge.usd_per_mtok_completion",
            j.usd_per_mtok_completion,
            "0..=10000",
        )?;
        check(
            (256..=1_000_000).contains(&j.max_stage_chars),
            "judge.max_stage_chars",
            j.max_stage_chars,
            "256..=1000000",
        )?;
        let r = &self.retry;
        check(
            r.max_retries <= 20,
            "retry.max_retries",
            r.max_retries,
            "0..=20",
        )?;
        check(
            r.min_delay_ms >= 1,
            "retry.min_delay_ms",
            r.min_delay_ms,
            ">= 1",
        )?;
        check(
            r.max_delay_ms >= r.min_delay_ms && r.max_delay_ms <= 600_000,
            "retry.max_delay_ms",
            r.max_delay_ms,
            "retry.min_delay_ms..=600000",
        )?;
        let h = &self.health;
        check(
            (1..=3600).contains(&h.probe_interval_secs),
            "health.probe_interval_secs",
            h.probe_interval_secs,
            "1..=3600",
        )?;
        check(
            (1..=100).contains(&h.failures_before_unhealthy),
            "health.failures_before_unhealthy",
            h.failures_before_unhealthy,
            "1..=100",
        )?;
        let ro = &self.rollout;
        check((1..=64).contains(&ro.n), "rollout.n", ro.n, "1..=64")?;
        check(
            (1..=4096).contains(&ro.tasks_per_step),
            "rollout.tasks_per_step",
            ro.tasks_per_step,
            "1..=4096",
        )?;
        check(
            ro.max_tool_calls <= 100,
            "rollout.max_tool_calls",
            ro.max_tool_calls,
            "0..=100",
        )?;
        check(
            (16..=262_144).contains(&ro.max_tokens),
            "rollout.max_tokens",
            ro.max_tokens,
            "16..=262144",
        )?;
        if let Some(f) = ro.forced_answer_tokens {
            check(
                f >= 1 && f < ro.max_tokens,
                "rollout.forced_answer_tokens",
                f,
                "1..rollout.max_tokens",
            )?;
        }
        check(
            ro.temperature > 0.0 && ro.temperature <= 2.0,
            "rollout.temperature",
            ro.temperature,
            "(0, 2]",
        )?;
        check(
            ro.top_p > 0.0 && ro.top_p <= 1.0,
            "rollout.top_p",
            ro.top_p,
            "(0, 1]",
        )?;
        if let Some(r) = ro.repetition_detection {
            check(
                (1..=1024).contains(&r.max_pattern_size),
                "rollout.repetition_detection.max_pattern_size",
                r.max_pattern_size,
                "1..=1024",
            )?;
            check(
                r.min_pattern_size >= 1 && r.min_pattern_size <= r.max_pattern_size,
                "rollout.repetition_detection.min_pattern_size",
                r.min_pattern_size,
                "1..=max_pattern_size",
            )?;
            check(
                (2..=1024).contains(&r.min_count),
                "rollout.repetition_detection.min_count",
                r.min_count,
                "2..=1024",
            )?;
        }
        check(
            !ro.answer_after_loop || ro.repetition_detection.is_some(),
            "rollout.answer_after_loop",
            "true without rollout.repetition_detection",
            "false unless rollout.repetition_detection is set (it answers after a loop stop)",
        )?;
        check(
            !self.credit.loop_tokens_only || ro.repetition_detection.is_some(),
            "credit.loop_tokens_only",
            "true without rollout.repetition_detection",
            "false unless rollout.repetition_detection is set (it finds the loop with that rule)",
        )?;
        check(
            !(self.credit.loop_tokens_only && self.credit.overlong_filter),
            "credit.loop_tokens_only",
            "true with credit.overlong_filter",
            "one of the two (the filter leaves loop-stopped attempts out of the loss whole)",
        )?;
        check(
            (0.0..=1.0).contains(&self.credit.negative_scale),
            "credit.negative_advantage_scale",
            self.credit.negative_scale,
            "0..=1 (1: the plain policy gradient; 0: positive advantages alone)",
        )?;
        check(
            (0.0..=1.0).contains(&self.credit.reflection_negative_scale),
            "credit.reflection_negative_advantage_scale",
            self.credit.reflection_negative_scale,
            "0..=1 (1: GRPO over the candidates as written; 0: the better-than-group ones alone)",
        )?;
        if let Some(x) = self.credit.loop_negative_scale {
            check(
                (0.0..=1.0).contains(&x),
                "credit.loop_negative_advantage_scale",
                x,
                "0..=1, or absent (credit.negative_advantage_scale)",
            )?;
            check(
                ro.repetition_detection.is_some(),
                "credit.loop_negative_advantage_scale",
                format!("{x} without rollout.repetition_detection"),
                "absent unless rollout.repetition_detection is set (only its loop stops use it)",
            )?;
        }
        if let Some(p) = &self.credit.guidance_demos {
            check(
                !p.as_os_str().is_empty() && !p.is_dir(),
                "credit.guidance_demos",
                format!("{:?}", p.display().to_string()),
                "a demonstrations file (the rows `orchestrator sft-data` writes), or absent (off)",
            )?;
        }
        let shaping = self.trainer.settings.off_policy_shaping;
        check(
            shaping == 0.0 || self.credit.guidance_demos.is_some(),
            "trainer.off_policy_shaping",
            format!("{shaping} without credit.guidance_demos"),
            "0 unless credit.guidance_demos is set (it shapes the demonstrations' tokens alone)",
        )?;
        let unlikelihood = self.trainer.settings.loop_unlikelihood > 0.0;
        check(
            !unlikelihood || ro.repetition_detection.is_some(),
            "trainer.loop_unlikelihood",
            format!(
                "{} without rollout.repetition_detection",
                self.trainer.settings.loop_unlikelihood
            ),
            "0 unless rollout.repetition_detection is set (it finds the loop with that rule)",
        )?;
        check(
            !(unlikelihood && self.credit.overlong_filter),
            "trainer.loop_unlikelihood",
            format!(
                "{} with credit.overlong_filter",
                self.trainer.settings.loop_unlikelihood
            ),
            "0 with the filter (it leaves loop-stopped attempts out of the loss whole)",
        )?;
        self.validate_eval()?;
        self.validate_tracking()
    }

    fn validate_tracking(&self) -> Result<(), ConfigError> {
        let t = &self.tracking;
        check(
            (1..=3600).contains(&t.poll_secs),
            "tracking.poll_secs",
            t.poll_secs,
            "1..=3600",
        )?;
        if let Some(d) = &t.tensorboard_dir {
            check(
                !d.as_os_str().is_empty(),
                "tracking.tensorboard_dir",
                "\"\"",
                "a directory path (or unset: no TensorBoard files)",
            )?;
        }
        if let Some(u) = &t.mlflow_url {
            validate_url("tracking.mlflow_url", u)?;
        }
        if let Some(e) = &t.mlflow_experiment {
            check(
                !e.trim().is_empty(),
                "tracking.mlflow_experiment",
                format!("{e:?}"),
                "a non-empty name (or unset: experiment.name)",
            )?;
        }
        Ok(())
    }

    fn validate_eval(&self) -> Result<(), ConfigError> {
        let ev = &self.eval;
        check((1..=64).contains(&ev.n), "eval.n", ev.n, "1..=64")?;
        check(
            ev.held_out <= 1_000_000,
            "eval.held_out",
            ev.held_out,
            "0..=1000000",
        )?;
        if let Some(t) = ev.temperature {
            check(
                t.is_finite() && (0.0..=2.0).contains(&t),
                "eval.temperature",
                t,
                "0..=2 (0 = greedy)",
            )?;
        }
        let mut names = std::collections::BTreeSet::new();
        for set in &ev.sets {
            check(
                !set.name.is_empty()
                    && set.name != HELD_OUT
                    && set
                        .name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c)),
                "eval.sets.name",
                format!("{:?}", set.name),
                "a plain name of letters, digits, '-' and '_', other than \"held-out\"",
            )?;
            check(
                names.insert(set.name.as_str()),
                "eval.sets.name",
                format!("{:?}", set.name),
                "a name used by one set only",
            )?;
            check(
                (1..=1_000_000).contains(&set.size),
                "eval.sets.size",
                set.size,
                "1..=1000000",
            )?;
            if let Some(n) = set.n {
                check((1..=64).contains(&n), "eval.sets.n", n, "1..=64")?;
                check(
                    set.benchmark.is_none(),
                    "eval.sets.n",
                    format!("{n} on benchmark set {:?}", set.name),
                    "unset on a set that names its benchmark (its protocol fixes the samples)",
                )?;
            }
            if let Some(t) = set.temperature {
                check(
                    t.is_finite() && (0.0..=2.0).contains(&t),
                    "eval.sets.temperature",
                    t,
                    "0..=2 (0 = greedy)",
                )?;
            }
            if let Some(b) = &set.benchmark {
                let parsed = b.parse::<crate::domain::bench::Benchmark>();
                check(
                    parsed.is_ok(),
                    "eval.sets.benchmark",
                    format!("{b:?}"),
                    "a benchmark `orchestrator eval --benchmark` knows (healthbench, simpleqa, 2wiki, drb, ...)",
                )?;
                if let Ok(bench) = parsed {
                    check(
                        bench.short_answer() || !set.judges.is_empty(),
                        "eval.sets.judges",
                        format!("[] for {bench}"),
                        "at least one gold judge ({url, model}) for a benchmark graded by an LLM",
                    )?;
                }
            } else {
                check(
                    set.judges.is_empty(),
                    "eval.sets.judges",
                    format!("{} judges on a set without a benchmark", set.judges.len()),
                    "gold judges only on a set that names its benchmark",
                )?;
            }
            for j in &set.judges {
                check(
                    !j.url.trim().is_empty() && !j.model.trim().is_empty(),
                    "eval.sets.judges",
                    format!("{{url = {:?}, model = {:?}}}", j.url, j.model),
                    "a non-empty url and model",
                )?;
            }
        }
        Ok(())
    }
}

fn check(
    ok: bool,
    field: &'static str,
    value: impl std::fmt::Display,
    allowed: &'static str,
) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            field,
            value: value.to_string(),
            allowed,
        })
    }
}

fn validate_url(field: &'static str, raw: &str) -> Result<(), ConfigError> {
    match url::Url::parse(raw) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(()),
        _ => Err(ConfigError::OutOfRange {
            field,
            value: format!("{raw:?}"),
            allowed: "an http:// or https:// URL with a host",
        }),
    }
}

fn validate_pool(
    role: &'static str,
    pool: &EndpointPoolConfig,
    need_urls: bool,
) -> Result<(), ConfigError> {
    let (urls_f, conc_f, timeout_f) = match role {
        "policy" => (
            "policy.urls",
            "policy.max_concurrency",
            "policy.timeout_secs",
        ),
        "judge" => ("judge.urls", "judge.max_concurrency", "judge.timeout_secs"),
        _ => (
            "embeddings.urls",
            "embeddings.max_concurrency",
            "embeddings.timeout_secs",
        ),
    };
    if need_urls {
        check(
            !pool.urls.is_empty(),
            urls_f,
            "[]",
            "at least one http(s) URL",
        )?;
    }
    for u in &pool.urls {
        validate_url(urls_f, u)?;
    }
    check(
        (1..=65_536).contains(&pool.max_concurrency),
        conc_f,
        pool.max_concurrency,
        "1..=65536",
    )?;
    check(
        (1..=86_400).contains(&pool.timeout_secs),
        timeout_f,
        pool.timeout_secs,
        "1..=86400",
    )?;
    Ok(())
}
