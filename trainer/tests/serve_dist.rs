//! `trainer serve --nproc-per-node 2`: the launcher starts two ranks of this binary (gloo on
//! CPU, one thread each); rank 0 serves HTTP and leads, rank 1 follows. Over HTTP the group
//! trains like one process on the same batches (uneven sequence lengths), a restore reaches
//! both ranks, and when a rank dies the launcher stops the job within seconds and names it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, model_dir, plain};

fn serve(model: &Path, ckpt: &Path, port: u16, nproc: usize, log: &Path) -> Child {
    serve_with(model, ckpt, port, nproc, log, &[])
}

fn serve_with(
    model: &Path,
    ckpt: &Path,
    port: u16,
    nproc: usize,
    log: &Path,
    extra: &[&str],
) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainer"));
    serve_args(&mut cmd, model, ckpt, port)
        .arg("--nproc-per-node")
        .arg(nproc.to_string())
        .args(extra);
    spawn_logged(&mut cmd, log)
}

/// `serve` on CPU, one thread, lr 1e-3, `model`, checkpoints in `ckpt`, HTTP on
/// 127.0.0.1:`port`, trainer logs at info, outside any torchrun job.
fn serve_args<'c>(cmd: &'c mut Command, model: &Path, ckpt: &Path, port: u16) -> &'c mut Command {
    cmd.args(["serve", "--device", "cpu", "--threads", "1", "--lr", "1e-3"])
        .arg("--model")
        .arg(model)
        .arg("--checkpoint-dir")
        .arg(ckpt)
        .arg("--bind")
        .arg(format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "trainer=info")
        .env_remove("WORLD_SIZE")
}

/// Start `cmd` with its stderr in `log`.
fn spawn_logged(cmd: &mut Command, log: &Path) -> Child {
    cmd.stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// Healthy, and answered by the server this log belongs to: its port was picked free and
/// released, so another test's server could hold it and answer the health check instead.
async fn wait_healthy(url: &str, log: &Path) {
    let t0 = Instant::now();
    loop {
        let ours = plain(&std::fs::read_to_string(log).unwrap_or_default())
            .contains("trainer serve listening");
        let ok = ours
            && trainer::publish::http_client()
                .get(format!("{url}/health"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
        if ok {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{url} never became healthy:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Eight sequences of uneven lengths (so the ranks' token counts differ), mixed advantages.
fn batch(seed: usize) -> wire::Batch {
    let seqs = (0..8)
        .map(|i| {
            let n = 12 + (i * 7 + seed) % 21;
            let tokens: Vec<u32> = (0..n)
                .map(|k| ((i * 31 + k * 7 + seed) % 250 + 5) as u32)
                .collect();
            let answer = n / 2;
            wire::WireSequence {
                unlikelihood: Vec::new(),
                loss_mask: (0..n).map(|k| k >= answer).collect(),
                stages: (0..n)
                    .map(|k| if k >= answer { (k % 4) as i8 } else { -1 })
                    .collect(),
                behaviour_logprobs: vec![-5.5; n],
                advantages: vec![
                    if i % 2 == 0 { 1.0 } else { -0.5 },
                    0.25,
                    -0.25,
                    if i % 3 == 0 { 1.0 } else { -1.0 },
                ],
                group_id: (i / 4) as u32,
                policy_version: 0,
                phase: wire::Phase::Task,
                tokens,
                off_policy: false,
            }
        })
        .collect();
    wire::Batch {
        policy_version: 0,
        rl: true,
        seqs,
    }
}

async fn post(url: &str, path: &str, body: Vec<u8>) -> (u16, serde_json::Value) {
    let r = trainer::publish::http_client()
        .post(format!("{url}{path}"))
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::json!({"raw": text})),
    )
}

async fn step(url: &str, b: &wire::Batch) -> serde_json::Value {
    let (status, body) = post(url, "/v1/train_step", b.encode().unwrap()).await;
    assert_eq!(status, 200, "{body}");
    body
}

fn close(what: &str, a: &serde_json::Value, b: &serde_json::Value) {
    let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
    assert!(
        (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
        "{what}: one rank {a} vs two ranks {b}"
    );
}

fn weights(dir: &Path) -> Vec<(String, Vec<f32>)> {
    let m =
        trainer::model::weights::read_model_dir(dir, tch::Device::Cpu, tch::Kind::Float).unwrap();
    m.into_iter()
        .map(|(k, t)| (k, Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()))
        .collect()
}

/// The pid the launcher logged for `rank`.
fn rank_pid(log: &Path, rank: usize) -> u32 {
    let text = plain(&std::fs::read_to_string(log).unwrap());
    let line = text
        .lines()
        .find(|l| l.contains("rank started") && l.contains(&format!("rank={rank} ")))
        .unwrap_or_else(|| panic!("no start line for rank {rank}:\n{text}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("pid="))
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ranks_serve_train_restore_like_one_and_stop_together() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path());
    let (p1, p2) = (free_port(), free_port());
    let (log1, log2) = (tmp.path().join("one.log"), tmp.path().join("two.log"));
    let mut one = serve(&model, &tmp.path().join("ck1"), p1, 1, &log1);
    let mut two = serve(&model, &tmp.path().join("ck2"), p2, 2, &log2);
    let (u1, u2) = (
        format!("http://127.0.0.1:{p1}"),
        format!("http://127.0.0.1:{p2}"),
    );
    wait_healthy(&u1, &log1).await;
    wait_healthy(&u2, &log2).await;

    let mut first = None;
    for seed in 0..2 {
        let b = batch(seed);
        let (a, c) = (step(&u1, &b).await, step(&u2, &b).await);
        for k in [
            "loss",
            "kl",
            "clip_fraction",
            "grad_norm",
            "entropy",
            "tokens",
        ] {
            close(k, &a["metrics"][k], &c["metrics"][k]);
        }
        assert_eq!(a["policy_version"], c["policy_version"]);
        if seed == 0 {
            first = Some(c["metrics"]["loss"].clone());
        }
    }
    // Same weights after two steps: checkpoints of both, compared tensor by tensor.
    let (s1, c1) = post(&u1, "/v1/checkpoint", b"{}".to_vec()).await;
    let (s2, c2) = post(&u2, "/v1/checkpoint", b"{}".to_vec()).await;
    assert_eq!((s1, s2), (200, 200), "{c1} {c2}");
    let w1 = weights(Path::new(c1["checkpoint"].as_str().unwrap()));
    let w2 = weights(Path::new(c2["checkpoint"].as_str().unwrap()));
    assert_eq!(w1.len(), w2.len());
    for ((k, a), (_, b)) in w1.iter().zip(&w2) {
        let d = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(d < 1e-5, "{k}: max |diff| {d}");
    }

    // A restore to version 0 reaches rank 1 too: the first batch trains as it did the first time.
    let (s, body) = post(&u2, "/v1/restore", b"{}".to_vec()).await;
    assert_eq!(s, 200, "{body}");
    let again = step(&u2, &batch(0)).await;
    close(
        "loss after restore",
        first.as_ref().unwrap(),
        &again["metrics"]["loss"],
    );

    // New settings reach rank 1 too: after the same restore, settings and step on the single
    // process, the group's next step matches it.
    let (s, _) = post(&u1, "/v1/restore", b"{}".to_vec()).await;
    assert_eq!(s, 200);
    step(&u1, &batch(0)).await;
    let mut settings: serde_json::Value = trainer::publish::http_client()
        .get(format!("{u1}/v1/settings"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    settings["settings"]["lr"] = serde_json::json!(3e-3);
    settings["settings"]["max_grad_norm"] = serde_json::json!(0.5);
    let body = serde_json::to_vec(&settings["settings"]).unwrap();
    for u in [&u1, &u2] {
        let (s, reply) = post(u, "/v1/settings", body.clone()).await;
        assert_eq!(s, 200, "{reply}");
    }
    // Two steps: the second's loss reads weights every rank updated with the new settings.
    for seed in [5, 6] {
        let (a, c) = (step(&u1, &batch(seed)).await, step(&u2, &batch(seed)).await);
        for k in ["loss", "lr", "grad_norm"] {
            close(k, &a["metrics"][k], &c["metrics"][k]);
        }
    }

    // A rank that dies stops the job: the launcher ends within seconds, naming it.
    let pid = rank_pid(&log2, 1);
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = two.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the launcher did not stop"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!status.success());
    let log = plain(&std::fs::read_to_string(&log2).unwrap());
    assert!(
        log.contains(&format!("rank 1 (pid {pid}) exited")),
        "the launcher names the rank: {log}"
    );
    let _ = one.kill();
    let _ = one.wait();
}

/// Stop a launcher (or a single server) the way a supervisor does, and reap it.
fn stop(child: &mut Child) {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_2_ranks_checkpoint_in_shards_and_resume_on_one_or_two_ranks_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path());
    let ck_zero = tmp.path().join("ck-zero");
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let url = |i: usize| format!("http://127.0.0.1:{}", ports[i]);
    let log = |i: usize| tmp.path().join(format!("{i}.log"));
    // 0: one process (reference), 1: two ranks with ZeRO-2.
    let mut one = serve(&model, &tmp.path().join("ck-one"), ports[0], 1, &log(0));
    let mut zero = serve_with(&model, &ck_zero, ports[1], 2, &log(1), &["--zero", "2"]);
    wait_healthy(&url(0), &log(0)).await;
    wait_healthy(&url(1), &log(1)).await;
    for seed in 0..2 {
        let (a, c) = (
            step(&url(0), &batch(seed)).await,
            step(&url(1), &batch(seed)).await,
        );
        for k in ["loss", "grad_norm", "kl"] {
            close(k, &a["metrics"][k], &c["metrics"][k]);
        }
    }
    let (s, c) = post(&url(1), "/v1/checkpoint", b"{}".to_vec()).await;
    assert_eq!(s, 200, "{c}");
    let dir = PathBuf::from(c["checkpoint"].as_str().unwrap());
    for f in [
        "optimizer.zero-0-of-2.safetensors",
        "optimizer.zero-1-of-2.safetensors",
        "optimizer.zero.json",
        "state.json",
    ] {
        assert!(dir.join(f).exists(), "{f} missing in {}", dir.display());
    }
    assert!(!dir.join("optimizer.safetensors").exists());
    // The reference continues; its next two steps are what every resumed layout must give.
    let want: Vec<serde_json::Value> = vec![
        step(&url(0), &batch(2)).await["metrics"]["loss"].clone(),
        step(&url(0), &batch(3)).await["metrics"]["loss"].clone(),
    ];
    stop(&mut zero);
    stop(&mut one);
    // Resume the sharded checkpoint on one process (shards reassembled) and on two ZeRO ranks.
    for (i, nproc, extra) in [
        (2, 1, vec!["--resume"]),
        (3, 2, vec!["--resume", "--zero", "2"]),
    ] {
        let mut child = serve_with(&model, &ck_zero, ports[i], nproc, &log(i), &extra);
        wait_healthy(&url(i), &log(i)).await;
        for (seed, want) in [2, 3].into_iter().zip(&want) {
            let got = step(&url(i), &batch(seed)).await;
            close(
                &format!("{nproc} rank(s), resumed, batch {seed}"),
                want,
                &got["metrics"]["loss"],
            );
        }
        stop(&mut child);
    }
}

/// Where one node of a two-node job runs: this network namespace, or another one (with the
/// interface gloo must use there).
#[derive(Clone, Copy)]
enum Host<'a> {
    Here,
    Netns { ns: &'a str, ifname: &'a str },
}

/// `trainer serve` as node `rank` of a two-node job of one rank each, its launcher's stderr in
/// `log`: MASTER_ADDR / MASTER_PORT name node 0's store; HTTP on 127.0.0.1:`port` of `host`.
#[allow(clippy::too_many_arguments)]
fn node(
    host: Host<'_>,
    model: &Path,
    ckpt: &Path,
    port: u16,
    rank: usize,
    master: (&str, u16),
    gloo_ifname: Option<&str>,
    log: &Path,
) -> Child {
    let mut cmd = match host {
        Host::Here => Command::new(env!("CARGO_BIN_EXE_trainer")),
        Host::Netns { ns, .. } => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_trainer")]);
            c
        }
    };
    serve_args(&mut cmd, model, ckpt, port)
        .args(["--nproc-per-node", "1", "--nnodes", "2", "--node-rank"])
        .arg(rank.to_string())
        .args(["--dist-timeout-secs", "30"])
        .env("MASTER_ADDR", master.0)
        .env("MASTER_PORT", master.1.to_string())
        .env_remove("GLOO_SOCKET_IFNAME");
    let ifname = match host {
        Host::Netns { ifname, .. } => Some(ifname),
        Host::Here => gloo_ifname,
    };
    if let Some(i) = ifname {
        cmd.env("GLOO_SOCKET_IFNAME", i);
    }
    spawn_logged(&mut cmd, log)
}

/// A two-node job of one rank each beside a single process on the same model, both trained on
/// the same two batches.
struct TwoNodes {
    one: Child,
    node0: Child,
    node1: Child,
    node0_url: String,
    model: PathBuf,
    logs: PathBuf,
}

impl TwoNodes {
    /// Start node 0, node 1 (global rank 1) and the single process; two steps on each, where
    /// the job's loss, gradient norm, KL and token count must equal the one process's.
    async fn trained(tmp: &Path, start: impl Fn(&Path, usize, u16, &Path) -> Child) -> Self {
        let model = model_dir(tmp);
        let (p_one, p_node0, p_node1) = (free_port(), free_port(), free_port());
        let log = |n: &str| tmp.join(format!("{n}.log"));
        let one = serve(&model, &tmp.join("ck-one"), p_one, 1, &log("one"));
        let node0 = start(&model, 0, p_node0, &log("node0"));
        let node1 = start(&model, 1, p_node1, &log("node1"));
        let (u1, u2) = (
            format!("http://127.0.0.1:{p_one}"),
            format!("http://127.0.0.1:{p_node0}"),
        );
        wait_healthy(&u1, &log("one")).await;
        wait_healthy(&u2, &log("node0")).await;
        let text = plain(&std::fs::read_to_string(log("node1")).unwrap());
        assert!(
            text.contains("rank started") && text.contains("rank=1 "),
            "node 1 started global rank 1: {text}"
        );
        for seed in 0..2 {
            let b = batch(seed);
            let (a, c) = (step(&u1, &b).await, step(&u2, &b).await);
            for k in ["loss", "grad_norm", "kl", "tokens"] {
                close(k, &a["metrics"][k], &c["metrics"][k]);
            }
        }
        Self {
            one,
            node0,
            node1,
            node0_url: u2,
            model,
            logs: tmp.to_path_buf(),
        }
    }

    fn log(&self, node: usize) -> String {
        plain(&std::fs::read_to_string(self.logs.join(format!("node{node}.log"))).unwrap())
    }

    /// Wait up to `limit` for node `n`'s launcher to exit; it must fail, naming rank `n`.
    async fn exits_naming_its_rank(&mut self, n: usize, limit: Duration) {
        let t0 = Instant::now();
        let status = loop {
            let child = if n == 0 {
                &mut self.node0
            } else {
                &mut self.node1
            };
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                t0.elapsed() < limit,
                "node {n} did not stop within {limit:?}:\n{}",
                self.log(n)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(!status.success());
        let text = self.log(n);
        assert!(
            text.contains(&format!("rank {n}")),
            "node {n}'s launcher names its rank: {text}"
        );
        eprintln!("node {n} stopped after {:?}", t0.elapsed());
    }
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        for c in [&mut self.one, &mut self.node0, &mut self.node1] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Two nodes of one rank each, as a multi-node job runs them (one launcher per node with
/// `--nnodes 2 --node-rank 0|1` and the same MASTER_ADDR / MASTER_PORT), here both on this
/// machine over loopback: the job trains like one process, and when node 0 goes away node 1's
/// rank notices within its store poll and its launcher exits naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_of_one_rank_train_like_one_process_and_stop_together() {
    let tmp = tempfile::tempdir().unwrap();
    let master = free_port();
    let ck = tmp.path().join("ck-nodes");
    let mut job = TwoNodes::trained(tmp.path(), |model, rank, port, log| {
        node(
            Host::Here,
            model,
            &ck,
            port,
            rank,
            ("127.0.0.1", master),
            None,
            log,
        )
    })
    .await;
    stop(&mut job.node0);
    job.exits_naming_its_rank(1, Duration::from_secs(45)).await;
}

/// A second host on this machine: a network namespace joined to this one by a veth pair, so
/// the two nodes have their own addresses, interfaces and routes and reach each other only over
/// that link (nothing over loopback). Removed on drop.
struct SecondHost {
    ns: String,
    here_if: String,
    there_if: String,
    here_ip: String,
}

impl SecondHost {
    /// The reason, where this process may not make namespaces (not root, no `ip`).
    fn new() -> Result<Self, String> {
        let id = std::process::id() % 100_000;
        let net = 16 + id % 200;
        let h = Self {
            ns: format!("rubricem-{id}"),
            here_if: format!("rbh{id}"),
            there_if: format!("rbt{id}"),
            here_ip: format!("10.213.{net}.1"),
        };
        let there_ip = format!("10.213.{net}.2");
        let ip = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("ip: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        ip(&["netns", "add", &h.ns])?;
        // From here on, drop removes what was made.
        ip(&[
            "link",
            "add",
            &h.here_if,
            "type",
            "veth",
            "peer",
            "name",
            &h.there_if,
        ])?;
        ip(&["link", "set", &h.there_if, "netns", &h.ns])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/24", h.here_ip),
            "dev",
            &h.here_if,
        ])?;
        ip(&["link", "set", &h.here_if, "up"])?;
        let there = |args: &[&str]| {
            let mut a = vec!["netns", "exec", &h.ns, "ip"];
            a.extend_from_slice(args);
            ip(&a)
        };
        there(&["addr", "add", &format!("{there_ip}/24"), "dev", &h.there_if])?;
        there(&["link", "set", &h.there_if, "up"])?;
        there(&["link", "set", "lo", "up"])?;
        Ok(h)
    }
}

impl SecondHost {
    /// Take the link down: from here on nothing crosses it and nothing answers.
    fn partition(&self) {
        let ok = Command::new("ip")
            .args(["link", "set", &self.here_if, "down"])
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip link set {} down", self.here_if);
    }

    /// Bytes this end of the link has sent.
    fn tx_bytes(&self) -> u64 {
        let p = format!("/sys/class/net/{}/statistics/tx_bytes", self.here_if);
        std::fs::read_to_string(&p).unwrap().trim().parse().unwrap()
    }
}

impl Drop for SecondHost {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the pair, and with it this end.
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.here_if])
            .stderr(Stdio::null())
            .status();
    }
}

/// The two-node job across two network stacks: node 1 runs in its own network namespace, so
/// its rendezvous with node 0's store and its gloo pairs go over the veth link between the
/// namespaces' addresses, as between two hosts (GLOO_SOCKET_IFNAME names each node's
/// interface, as a multi-node job on hosts with several interfaces must). Then the link goes
/// down, a partition in which no peer closes a connection (nothing answers at all): the next
/// step must fail within the collective timeout, naming the operation, and both nodes must
/// stop on their own. Needs root for the namespace; elsewhere it says so and does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_in_separate_network_namespaces_train_like_one_process_and_survive_a_partition() {
    let host = match SecondHost::new() {
        Ok(h) => h,
        Err(why) => {
            eprintln!("skipped: no second network namespace here ({why})");
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let master = free_port();
    let ck = tmp.path().join("ck-nodes");
    let there = Host::Netns {
        ns: &host.ns,
        ifname: &host.there_if,
    };
    let mut job = TwoNodes::trained(tmp.path(), |model, rank, port, log| {
        let (h, ifname) = if rank == 0 {
            (Host::Here, Some(host.here_if.as_str()))
        } else {
            (there, None)
        };
        node(
            h,
            model,
            &ck,
            port,
            rank,
            (&host.here_ip, master),
            ifname,
            log,
        )
    })
    .await;
    // The gradients went over the link: at least one gradient's bytes left this end (two
    // steps' all-reduces, each sending half the gradient twice).
    let grad_bytes: usize = weights(&job.model).iter().map(|(_, w)| 4 * w.len()).sum();
    let sent = host.tx_bytes();
    assert!(
        sent >= grad_bytes as u64,
        "{sent} bytes sent over {} for a {grad_bytes}-byte gradient",
        host.here_if
    );
    eprintln!(
        "{sent} bytes sent over {} ({grad_bytes}-byte gradient)",
        host.here_if
    );

    host.partition();
    let t0 = Instant::now();
    let (status, body) = post(&job.node0_url, "/v1/train_step", batch(2).encode().unwrap()).await;
    let took = t0.elapsed();
    eprintln!("step across the partition: {status} after {took:?}: {body}");
    assert_eq!(status, 500, "{body}");
    // --dist-timeout-secs 30, and some slack for this 2-core machine.
    assert!(took < Duration::from_secs(50), "took {took:?}");
    let why = body.to_string();
    assert!(
        why.contains("data-parallel train step") && why.contains("the group is stopping"),
        "{why}"
    );
    job.exits_naming_its_rank(0, Duration::from_secs(30)).await;
    // Node 1 hears nothing from node 0's store: it must give up within a poll and a timeout,
    // saying why (its probe failed, or its watchdog ended a store call that would block).
    job.exits_naming_its_rank(1, Duration::from_secs(60)).await;
    let text = job.log(1);
    assert!(
        text.contains("rank 1: rank 0 stopped answering")
            || ["get", "delete", "set"].iter().any(|op| {
                text.lines().any(|l| {
                    l.contains(&format!("rank 1: store {op} `"))
                        && l.contains("did not return by its deadline")
                })
            }),
        "node 1 says why it stopped: {text}"
    );
}
