//! compose.yaml agrees with the orchestrator: every environment name it sets is one the CLI
//! reads, every URL points at a service and its container port, published ports match the
//! presets' default URLs and bind to loopback only, and vLLM is started for LoRA RL.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test and benchmark code fails loudly"
)]

use std::collections::HashMap;

use orchestrator::domain::config::{Config, DEFAULT_DATABASE_URL, Overrides};
use serde_json::Value;

fn compose() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../compose.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    serde_norway::from_str(&text).unwrap()
}

/// `${NAME:-default}` resolves to its default; anything else is taken as is.
fn resolve(raw: &str) -> String {
    let mut out = String::new();
    let mut rest = raw;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').map(|e| start + e).unwrap();
        let inner = &rest[start + 2..end];
        out.push_str(inner.split_once(":-").map(|(_, d)| d).unwrap_or(""));
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// (host ip, host port, container port) of each `ports:` entry.
fn ports(svc: &Value) -> Vec<(String, u16, u16)> {
    svc["ports"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    let parts: Vec<&str> = p.as_str().unwrap().split(':').collect();
                    assert_eq!(parts.len(), 3, "ports must name the host ip: {p}");
                    (
                        parts[0].to_string(),
                        parts[1].parse().unwrap(),
                        parts[2].parse().unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn url_host_port(u: &str) -> (String, u16) {
    let u = url::Url::parse(u).unwrap();
    (
        u.host_str().unwrap().to_string(),
        u.port_or_known_default().unwrap(),
    )
}

#[test]
fn services_exist_with_profiles_and_healthcheck() {
    let c = compose();
    let s = &c["services"];
    for name in [
        "postgres",
        "vllm-policy",
        "vllm-judge",
        "trainer",
        "orchestrator",
        "init",
        "dashboard",
    ] {
        assert!(s.get(name).is_some(), "service {name} missing");
    }
    for gpu in ["vllm-policy", "vllm-judge"] {
        assert!(
            s[gpu]["profiles"]
                .as_array()
                .unwrap()
                .contains(&serde_json::json!("gpu")),
            "{gpu} belongs to the gpu profile"
        );
    }
    assert!(s["postgres"]["healthcheck"]["test"].is_array());
    assert!(c["volumes"].get("pgdata").is_some());
    assert_eq!(
        s["orchestrator"]["depends_on"]["postgres"]["condition"], "service_healthy",
        "the orchestrator waits for a healthy database"
    );
}

#[test]
fn every_port_binds_loopback_and_matches_defaults() {
    let c = compose();
    let s = &c["services"];
    let smoke = Config::load("smoke", &Overrides::default()).unwrap();
    let ablation = Config::load("ablation-600", &Overrides::default()).unwrap();
    for (name, svc) in s.as_object().unwrap() {
        for (ip, _, _) in ports(svc) {
            assert_eq!(ip, "127.0.0.1", "{name} publishes on {ip}");
        }
    }
    let host_port = |svc: &str| ports(&s[svc])[0].1;
    assert_eq!(host_port("postgres"), url_host_port(DEFAULT_DATABASE_URL).1);
    assert_eq!(host_port("trainer"), url_host_port(&smoke.trainer.url).1);
    assert_eq!(
        host_port("trainer"),
        url_host_port(&smoke.policy.urls[0]).1,
        "smoke policy = trainer serve"
    );
    assert_eq!(
        host_port("vllm-policy"),
        url_host_port(&ablation.policy.urls[0]).1
    );
    assert_eq!(
        host_port("vllm-judge"),
        url_host_port(&ablation.judge.urls[0]).1
    );
    assert_eq!(host_port("trainer"), url_host_port(&ablation.trainer.url).1);
}

#[test]
fn orchestrator_environment_is_known_and_points_at_services() {
    let c = compose();
    let s = &c["services"];
    let known = orchestrator::cli::env_vars();
    let env: HashMap<String, String> = s["orchestrator"]["environment"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), resolve(v.as_str().unwrap())))
        .collect();
    for k in env.keys() {
        if k == "RUST_LOG" {
            continue;
        }
        assert!(
            known.contains(k),
            "compose sets {k}, which the orchestrator does not read ({known:?})"
        );
    }
    let container_port = |svc: &str| ports(&s[svc])[0].2;
    for key in [
        "DATABASE_URL",
        "ORCH_POLICY_URLS",
        "ORCH_JUDGE_URLS",
        "ORCH_TRAINER_URL",
    ] {
        for u in env[key].split(',') {
            let (host, port) = url_host_port(u);
            assert!(s.get(&host).is_some(), "{key}={u}: no service `{host}`");
            assert_eq!(
                port,
                container_port(&host),
                "{key}={u}: `{host}` listens on {}",
                container_port(&host)
            );
        }
    }
    let db = url::Url::parse(&env["DATABASE_URL"]).unwrap();
    let default = url::Url::parse(DEFAULT_DATABASE_URL).unwrap();
    assert_eq!(db.path(), default.path(), "same database name");
    assert_eq!(db.username(), default.username());
    assert_eq!(
        resolve(
            s["postgres"]["environment"]["POSTGRES_DB"]
                .as_str()
                .unwrap()
        ),
        &default.path()[1..]
    );
    // The preset named by ORCH_EXPERIMENT exists.
    assert!(
        orchestrator::domain::config::preset_names().contains(&env["ORCH_EXPERIMENT"].as_str())
    );
}

#[test]
fn vllm_servers_are_configured_for_rl() {
    let c = compose();
    let s = &c["services"];
    let ablation = Config::load("ablation-600", &Overrides::default()).unwrap();
    for (svc, model, port) in [
        (
            "vllm-policy",
            ablation.policy.model.as_str(),
            url_host_port(&ablation.policy.urls[0]).1,
        ),
        (
            "vllm-judge",
            ablation.judge.model.as_str(),
            url_host_port(&ablation.judge.urls[0]).1,
        ),
    ] {
        let args: Vec<String> = s[svc]["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| resolve(a.as_str().unwrap()))
            .collect();
        assert!(
            args.contains(&format!("--served-model-name={model}")),
            "{svc}: {args:?}"
        );
        assert!(args.contains(&format!("--port={port}")), "{svc}: {args:?}");
        assert_eq!(ports(&s[svc])[0].2, port);
    }
    let policy: Vec<String> = s["vllm-policy"]["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert!(policy.contains(&"--enable-lora".to_string()));
    assert!(policy.contains(&"--logprobs-mode=processed_logprobs".to_string()));
    assert_eq!(
        s["vllm-policy"]["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"],
        "True"
    );
    // `trainer serve` listens where the published port points (TRAINER_BIND = --bind).
    assert!(
        s["trainer"]["entrypoint"][2]
            .as_str()
            .unwrap()
            .ends_with("exec trainer serve")
    );
    let bind = s["trainer"]["environment"]["TRAINER_BIND"]
        .as_str()
        .unwrap();
    assert_eq!(bind, format!("0.0.0.0:{}", ports(&s["trainer"])[0].2));
    assert!(
        s["trainer"]["environment"]["TRAINER_MODEL"]
            .as_str()
            .is_some()
    );
}

/// A fresh clone's `docker compose up`: the one-shot init runs scripts/init-smoke.sh into the
/// directory the trainer loads and the smoke preset names, before the trainer, orchestrator and
/// dashboard start; servers listening on all interfaces inside the network get the token init
/// wrote; the dashboard publishes its default port on loopback.
#[test]
fn init_prepares_what_the_services_load_and_the_dashboard_is_served() {
    let c = compose();
    let s = &c["services"];
    let smoke = Config::load("smoke", &Overrides::default()).unwrap();
    let init = s["init"]["command"][0].as_str().unwrap();
    assert!(
        init.contains("/opt/rubricem/scripts/init-smoke.sh /runs/smoke"),
        "{init}"
    );
    let dockerfile = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../Dockerfile"),
    )
    .unwrap();
    assert!(
        dockerfile.contains("COPY scripts/init-smoke.sh /opt/rubricem/scripts/init-smoke.sh")
            && dockerfile.contains("AS init"),
        "the init image carries the script"
    );
    // ...and every helper script it runs from its own directory (`$(dirname
    // "${BASH_SOURCE[0]}")/NAME`), beside it.
    let script = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/init-smoke.sh"),
    )
    .unwrap();
    let marker = "$(dirname \"${BASH_SOURCE[0]}\")/";
    let helpers: Vec<&str> = script
        .split(marker)
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap_or(""))
        .filter(|name| !name.starts_with(".."))
        .collect();
    assert!(
        helpers.contains(&"tokenizer-corpus.py"),
        "helpers found: {helpers:?}"
    );
    for helper in helpers {
        assert!(
            dockerfile.contains(&format!(
                "COPY scripts/{helper} /opt/rubricem/scripts/{helper}"
            )),
            "the init image lacks scripts/{helper}, which init-smoke.sh runs"
        );
    }
    for svc in ["trainer", "orchestrator", "dashboard"] {
        assert_eq!(
            s[svc]["depends_on"]["init"]["condition"], "service_completed_successfully",
            "{svc} waits for init"
        );
    }
    // The model the trainer serves and the tokenizer the smoke preset reads are init's output
    // (the orchestrator's working directory is /, where ./runs is mounted).
    let model = s["trainer"]["environment"]["TRAINER_MODEL"]
        .as_str()
        .unwrap();
    assert_eq!(model, "/runs/smoke/model-sft");
    assert_eq!(
        format!("/{}", smoke.data.tokenizer.display()),
        model,
        "smoke's data.tokenizer"
    );
    assert_eq!(
        format!("/{}", smoke.data.tasks.display()),
        "/runs/smoke/world/tasks.jsonl"
    );
    assert!(script.contains("\"$DIR/model-sft\"") && script.contains("\"$DIR/world\""));
    // Token: every server bound to 0.0.0.0 inside the network reads it from init's file.
    for (svc, var) in [
        ("trainer", "TRAINER_API_TOKEN"),
        ("orchestrator", "TRAINER_API_TOKEN"),
        ("dashboard", orchestrator::pipeline::dashboard::TOKEN_ENV),
    ] {
        let entry = s[svc]["entrypoint"][2].as_str().unwrap();
        assert!(
            entry.contains(&format!("{var}=$$(cat /runs/.token)")),
            "{svc}: {entry}"
        );
    }
    let default: std::net::SocketAddr = orchestrator::pipeline::dashboard::DEFAULT_BIND
        .parse()
        .unwrap();
    assert_eq!(ports(&s["dashboard"])[0].1, default.port());
    let bind: std::net::SocketAddr = s["dashboard"]["environment"]["ORCH_DASHBOARD_BIND"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(ports(&s["dashboard"])[0].2, bind.port());
    let known = orchestrator::cli::env_vars();
    for k in s["dashboard"]["environment"].as_object().unwrap().keys() {
        assert!(k == "RUST_LOG" || known.contains(k), "dashboard: {k}");
    }
    // The orchestrator's policy client sends the token to the trainer's generation routes.
    let set = resolve(
        s["orchestrator"]["environment"]["ORCH_SET"]
            .as_str()
            .unwrap(),
    );
    let cfg = Config::load(
        "smoke",
        &Overrides {
            sets: set.split(';').map(String::from).collect(),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(cfg.policy.api_key_env.as_deref(), Some("TRAINER_API_TOKEN"));
}

/// The multi-GPU profile: a data-parallel trainer with one rank per reserved GPU (NCCL),
/// publishing to every vLLM policy server of the profile at its container port.
#[test]
fn the_multi_gpu_profile_runs_one_rank_per_gpu_and_publishes_to_each_policy_server() {
    let c = compose();
    let s = &c["services"];
    let t = &s["trainer-multi"];
    assert_eq!(t["profiles"], serde_json::json!(["gpu-multi"]));
    let env = |k: &str| resolve(t["environment"][k].as_str().unwrap());
    let ranks: usize = env("TRAINER_NPROC_PER_NODE").parse().unwrap();
    let gpus = &t["deploy"]["resources"]["reservations"]["devices"][0]["count"];
    let gpus: usize = match gpus {
        Value::Number(n) => n.as_u64().unwrap() as usize,
        v => resolve(v.as_str().unwrap()).parse().unwrap(),
    };
    assert!(ranks > 1 && ranks == gpus, "{ranks} ranks on {gpus} GPUs");
    assert_eq!(env("TRAINER_DEVICE"), "cuda");
    assert_eq!(env("TRAINER_DIST_BACKEND"), "nccl");
    let urls = env("TRAINER_PUBLISH_URLS");
    let servers: Vec<&str> = urls.split(',').collect();
    assert!(servers.len() >= 2, "{urls}");
    for u in servers {
        let (host, port) = url_host_port(u);
        let svc = &s[&host];
        assert!(
            svc["profiles"]
                .as_array()
                .unwrap()
                .contains(&serde_json::json!("gpu-multi")),
            "{host} runs in the profile"
        );
        assert_eq!(port, ports(svc)[0].2, "{u}");
    }
    assert!(
        t["entrypoint"][2]
            .as_str()
            .unwrap()
            .contains("TRAINER_API_TOKEN=$$(cat /runs/.token)")
    );
}

/// A trainer service on NCCL (its own setting, or `auto` on CUDA) must be the image built with
/// the `nccl` feature: the default build refuses NCCL groups at start.
#[test]
fn trainers_on_nccl_are_built_with_the_nccl_feature() {
    let c = compose();
    let mut on_nccl = 0;
    for (name, svc) in c["services"].as_object().unwrap() {
        let env = &svc["environment"];
        let var = |k: &str| env.get(k).and_then(Value::as_str).map(resolve);
        let backend = var("TRAINER_DIST_BACKEND").unwrap_or_else(|| "auto".into());
        let cuda = var("TRAINER_DEVICE").is_some_and(|d| d.starts_with("cuda"));
        let ranks: usize = var("TRAINER_NPROC_PER_NODE").map_or(1, |n| n.parse().unwrap());
        if backend == "nccl" || (backend == "auto" && cuda && ranks > 1) {
            on_nccl += 1;
            let features = svc["build"]["args"]["TRAINER_FEATURES"]
                .as_str()
                .unwrap_or_default();
            assert!(
                features.split([',', ' ']).any(|f| f == "nccl"),
                "{name} runs NCCL groups but builds with TRAINER_FEATURES={features:?}"
            );
        }
    }
    assert!(
        on_nccl > 0,
        "no trainer service runs NCCL (the gpu-multi profile does)"
    );
}
