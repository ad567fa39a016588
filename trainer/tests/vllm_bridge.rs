//! vLLM's NCCL weight-transfer route, everything but NCCL itself (no GPU here): against two
//! scripted fake vLLM servers (1 and 2 workers) the handshake asks each its world size, gives
//! each its rank offset in one group of 4, publishes the pickled `ncclUniqueId` in a real c10d
//! TCPStore (read back as a client, and unpickled by CPython with a stub of vLLM's module), and
//! a push sends start / update_info / finish in order while the weights go out packed by
//! vLLM's exceed-then-flush rule, byte for byte. A server that fails a route is named.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use tch::{Kind, Tensor};
use trainer::dist::vllm::{Bridge, BridgeError, DEFAULT_UNIQUE_ID_MODULE, WeightComm, pack_groups};

#[derive(Default)]
struct Fake {
    world: usize,
    calls: Mutex<Vec<(String, Value)>>,
    fail: Mutex<Option<String>>,
}

async fn world_size(State(f): State<Arc<Fake>>) -> Json<Value> {
    Json(json!({"world_size": f.world}))
}

async fn route(
    State(f): State<Arc<Fake>>,
    UrlPath(name): UrlPath<String>,
    body: Option<Json<Value>>,
) -> (StatusCode, String) {
    f.calls
        .lock()
        .unwrap()
        .push((name.clone(), body.map(|b| b.0).unwrap_or(Value::Null)));
    if f.fail.lock().unwrap().as_deref() == Some(name.as_str()) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "engine not initialised".into(),
        );
    }
    (StatusCode::OK, "{}".into())
}

async fn serve(world: usize) -> (String, Arc<Fake>) {
    let fake = Arc::new(Fake {
        world,
        ..Fake::default()
    });
    let app = Router::new()
        .route("/get_world_size", get(world_size))
        .route("/{name}", post(route))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), fake)
}

/// The NCCL stand-in: a fixed unique id, and every broadcast buffer kept.
struct Recorder {
    id: [u8; 128],
    inits: Arc<Mutex<Vec<usize>>>,
    sent: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl WeightComm for Recorder {
    fn unique_id(&mut self) -> Result<[u8; 128], BridgeError> {
        Ok(self.id)
    }
    fn init(&mut self, _id: &[u8; 128], world: usize) -> Result<(), BridgeError> {
        self.inits.lock().unwrap().push(world);
        Ok(())
    }
    fn broadcast(&mut self, buf: &Tensor) -> Result<(), BridgeError> {
        assert_eq!(buf.kind(), Kind::Uint8);
        self.sent
            .lock()
            .unwrap()
            .push(Vec::<u8>::try_from(buf).unwrap());
        Ok(())
    }
}

fn python() -> PathBuf {
    std::env::var("TRAINER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_and_packed_push_speak_vllms_protocol() {
    let (u1, f1) = serve(1).await;
    let (u2, f2) = serve(2).await;
    let mut id = [0u8; 128];
    for (i, b) in id.iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let inits = Arc::new(Mutex::new(Vec::new()));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let comm = Recorder {
        id,
        inits: inits.clone(),
        sent: sent.clone(),
    };
    let http = trainer::publish::http_client();
    let mut bridge = Bridge::connect(
        http,
        &[u1.clone(), u2.clone()],
        "127.0.0.1",
        DEFAULT_UNIQUE_ID_MODULE,
        Box::new(comm),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(bridge.world, 4, "trainer + 1 + 2 workers");
    assert_eq!(*inits.lock().unwrap(), vec![4]);
    for (fake, offset) in [(&f1, 1), (&f2, 2)] {
        let calls = fake.calls.lock().unwrap().clone();
        assert_eq!(calls[0].0, "init_weight_transfer_engine");
        let info = &calls[0].1["init_info"];
        assert_eq!(info["rank_offset"], offset);
        assert_eq!(info["world_size"], 4);
        assert_eq!(info["master_port"], bridge.master_port);
        assert_eq!(info["master_address"], "127.0.0.1");
        assert_eq!(info["packed"], true);
    }

    // What vLLM's ranks read from the store: the pickled unique id.
    let client =
        trainer::dist::store_client("127.0.0.1", bridge.master_port, 4, Duration::from_secs(5))
            .unwrap();
    let pickled = client
        .get("broadcast_from/0/0", Duration::from_secs(5))
        .unwrap();
    assert_eq!(
        pickled,
        trainer::dist::vllm::unique_id_pickle(DEFAULT_UNIQUE_ID_MODULE, &id)
    );
    // CPython unpickles it into vLLM's ctypes structure (a stub of the module) with our bytes.
    let stub = tempfile::tempdir().unwrap();
    let pkg = stub.path().join("vllm/distributed/device_communicators");
    std::fs::create_dir_all(&pkg).unwrap();
    for d in [
        "vllm",
        "vllm/distributed",
        "vllm/distributed/device_communicators",
    ] {
        std::fs::write(stub.path().join(d).join("__init__.py"), "").unwrap();
    }
    std::fs::write(
        pkg.join("pynccl_wrapper.py"),
        "import ctypes\nclass ncclUniqueId(ctypes.Structure):\n    _fields_ = [(\"internal\", ctypes.c_byte * 128)]\n",
    )
    .unwrap();
    let script = "import pickle, sys\nobj = pickle.loads(open(sys.argv[1], 'rb').read())\nprint(type(obj).__module__ + '.' + type(obj).__name__)\nprint(bytes(obj.internal).hex())\n";
    let blob = stub.path().join("id.pickle");
    std::fs::write(&blob, &pickled).unwrap();
    let out = std::process::Command::new(python())
        .args(["-c", script])
        .arg(&blob)
        .env("PYTHONPATH", stub.path())
        .output()
        .expect("python (scripts/python-env.sh)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap(),
        "vllm.distributed.device_communicators.pynccl_wrapper.ncclUniqueId"
    );
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(lines.next().unwrap(), hex);

    // A push with a small buffer: sizes 16, 24, 8, 40, 4 bytes with a 32-byte buffer.
    bridge.buffer_bytes = 32;
    let params = vec![
        (
            "model.a".to_string(),
            Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]),
        ),
        (
            "model.b".to_string(),
            Tensor::from_slice(&[5i64, 6, 7]).view([3, 1]),
        ),
        ("model.c".to_string(), Tensor::from_slice(&[0.5f32, -0.5])),
        (
            "model.d".to_string(),
            Tensor::arange(20, (Kind::Int16, tch::Device::Cpu)).view([4, 5]),
        ),
        ("model.e".to_string(), Tensor::from_slice(&[9.0f32])),
    ];
    let stats = bridge.push("v3", &params).await.unwrap();
    assert_eq!((stats.tensors, stats.bytes), (5, 92));
    let groups = pack_groups(&[16, 24, 8, 40, 4], 32);
    assert_eq!(groups, vec![0..2, 2..4, 4..5]);
    assert_eq!(stats.buffers, 3);
    let bytes_of = |t: &Tensor| -> Vec<u8> {
        Vec::<u8>::try_from(t.contiguous().view([-1]).view_dtype(Kind::Uint8)).unwrap()
    };
    {
        let sent = sent.lock().unwrap();
        assert_eq!(sent.len(), 3);
        for (g, buf) in groups.iter().zip(sent.iter()) {
            let want: Vec<u8> = params[g.clone()]
                .iter()
                .flat_map(|(_, t)| bytes_of(t))
                .collect();
            assert_eq!(buf, &want);
        }
    }
    for fake in [&f1, &f2] {
        let calls = fake.calls.lock().unwrap().clone();
        let names: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "init_weight_transfer_engine",
                "start_weight_update",
                "update_weights",
                "finish_weight_update"
            ]
        );
        let info = &calls[2].1["update_info"];
        assert_eq!(
            info["names"],
            json!(["model.a", "model.b", "model.c", "model.d", "model.e"])
        );
        assert_eq!(
            info["dtype_names"],
            json!(["float32", "int64", "float32", "int16", "float32"])
        );
        assert_eq!(info["shapes"], json!([[4], [3, 1], [2], [4, 5], [1]]));
        assert_eq!(info["packed_buffer_size_bytes"], 32);
        assert_eq!(calls[3].1, json!({"weight_version": "v3"}));
    }

    // A server failing a route fails the push and is named.
    *f2.fail.lock().unwrap() = Some("update_weights".into());
    let err = bridge.push("v4", &params).await.unwrap_err().to_string();
    assert!(
        err.contains(&u2) && err.contains("/update_weights") && err.contains("500"),
        "{err}"
    );
}

#[tokio::test]
async fn a_server_without_the_dev_routes_is_refused_by_name() {
    let app = Router::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let comm = Recorder {
        id: [0; 128],
        inits: Arc::default(),
        sent: Arc::default(),
    };
    let url = format!("http://{addr}");
    let err = match Bridge::connect(
        trainer::publish::http_client(),
        std::slice::from_ref(&url),
        "127.0.0.1",
        DEFAULT_UNIQUE_ID_MODULE,
        Box::new(comm),
        Duration::from_secs(5),
    )
    .await
    {
        Ok(_) => panic!("connected to a server without the routes"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&url)
            && err.contains("/get_world_size")
            && err.contains("VLLM_SERVER_DEV_MODE"),
        "{err}"
    );
}

/// `trainer serve` with `--publish-route nccl` (in-process, the recording communicator in NCCL's
/// place): the first train step runs the handshake, every step pushes the new version's full
/// weights (the policy's own tensors, byte for byte) with start / update_info / finish
/// `vN`, and the reply reports the server as loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trainer_serve_publishes_each_version_over_the_nccl_route() {
    use trainer::publish::{PublishConfig, PublishTarget, Publisher, ServerKind};
    use trainer::service::load;
    let tmp = tempfile::tempdir().unwrap();
    let model = common::model_dir(tmp.path());
    let (url, fake) = serve(1).await;
    let inits = Arc::new(Mutex::new(Vec::new()));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let comm = Recorder {
        id: [7u8; 128],
        inits: inits.clone(),
        sent: sent.clone(),
    };
    let publisher = Publisher::new(PublishConfig {
        root: tmp.path().join("published"),
        name: "policy".into(),
        window: 2,
        retries: 0,
        targets: vec![PublishTarget {
            url: url.clone(),
            kind: ServerKind::Vllm,
        }],
        lora: false,
    })
    .with_route(Box::new(trainer::dist::vllm::NcclRoute::new(
        "127.0.0.1",
        DEFAULT_UNIQUE_ID_MODULE,
        Box::new(comm),
        Duration::from_secs(10),
    )));
    assert!(publisher.uses_nccl());
    let mut train = trainer::train::TrainConfig::default();
    train.optim.lr = 1e-3;
    let opts = load::LoadOptions::from_config(model.clone(), &train, None, tch::Device::Cpu, 11);
    let server = common::serve_in_process(opts, None, Some(publisher), None).await;
    let (addr, state) = (
        server.url.trim_start_matches("http://").to_string(),
        server.state,
    );
    let batch = wire::Batch {
        policy_version: 0,
        rl: false,
        seqs: vec![wire::WireSequence {
            unlikelihood: Vec::new(),
            tokens: (5..40).collect(),
            loss_mask: (0..35).map(|k| k >= 10).collect(),
            stages: vec![-1; 35],
            behaviour_logprobs: vec![0.0; 35],
            advantages: vec![],
            group_id: 0,
            policy_version: 0,
            phase: wire::Phase::Task,
            off_policy: false,
        }],
    };
    let bytes_of = |t: &Tensor| -> Vec<u8> {
        Vec::<u8>::try_from(t.contiguous().view([-1]).view_dtype(Kind::Uint8)).unwrap()
    };
    for version in 1..=2 {
        let r = trainer::publish::http_client()
            .post(format!("http://{addr}/v1/train_step"))
            .body(batch.encode().unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let reply: Value = r.json().await.unwrap();
        assert_eq!(
            reply["published"]["loaded"],
            json!([url.clone()]),
            "{reply}"
        );
        assert_eq!(reply["published"]["failed"], json!([]));
        // What went over the wire is the policy's weights after this step.
        let want: Vec<u8> = {
            let p = state.policy.lock().unwrap();
            p.trainer
                .model
                .base_tensors()
                .iter()
                .flat_map(|(_, t)| bytes_of(t))
                .collect()
        };
        let got: Vec<u8> = std::mem::take(&mut *sent.lock().unwrap()).concat();
        assert_eq!(got.len(), want.len(), "version {version}");
        assert!(
            got == want,
            "version {version}: the pushed bytes are the policy's"
        );
    }
    assert_eq!(
        inits.lock().unwrap().len(),
        1,
        "one handshake for every version"
    );
    let calls = fake.calls.lock().unwrap().clone();
    let names: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "init_weight_transfer_engine",
            "start_weight_update",
            "update_weights",
            "finish_weight_update",
            "start_weight_update",
            "update_weights",
            "finish_weight_update"
        ]
    );
    assert_eq!(calls[3].1, json!({"weight_version": "v1"}));
    assert_eq!(calls[6].1, json!({"weight_version": "v2"}));
    assert!(
        calls[2].1["update_info"]["names"][0]
            .as_str()
            .unwrap()
            .starts_with("model.")
    );
}
