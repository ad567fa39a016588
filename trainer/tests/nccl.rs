//! The `nccl` feature's build (scripts/check-nccl.sh builds and runs it; CI's default build
//! leaves the feature off). Where the machine has no GPU, these tests show that a CUDA build
//! links and loads, that NCCL answers what it can answer without one (a fresh unique id, the
//! first step of vLLM's weight-transfer handshake), and that what needs a GPU fails at once with
//! an error naming the backend and the cause, never a hang or a crash. Where CUDA is available
//! they run the real thing on device 0: a one-rank ProcessGroupNCCL's collectives and a raw
//! NCCL communicator's broadcast.
#![cfg(feature = "nccl")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};
use trainer::dist::vllm::{NcclComm, WeightComm};
use trainer::dist::{BackendKind, C10d, Collective, DistEnv, DistOptions, ReduceOp};

/// A one-rank world on a free loopback port.
fn one_rank() -> DistEnv {
    let port = common::free_port();
    DistEnv {
        rank: 0,
        world: 1,
        local_rank: 0,
        local_world: 1,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        agent_store: false,
    }
}

fn nccl_group(timeout: Duration) -> trainer::dist::Result<C10d> {
    C10d::init(
        &one_rank(),
        &DistOptions {
            backend: BackendKind::Nccl,
            timeout,
            ..DistOptions::default()
        },
    )
}

#[test]
fn the_cuda_build_loads_and_sees_the_devices_torch_sees() {
    // Linked against libtorch_cuda, libcudart and libnccl: the test binary would not start
    // otherwise. CUDA is reported exactly when a driver and a device exist.
    let n = tch::Cuda::device_count();
    assert_eq!(tch::Cuda::is_available(), n > 0, "{n} devices");
}

#[test]
fn nccl_unique_ids_are_fresh() {
    // ncclGetUniqueId needs no GPU (it opens NCCL's bootstrap socket): what the trainer
    // publishes to vLLM's workers before any of them joins.
    let mut comm = NcclComm::new(0);
    let a = WeightComm::unique_id(&mut comm).unwrap();
    let b = WeightComm::unique_id(&mut comm).unwrap();
    assert_ne!(a, b, "two calls gave the same id");
    assert!(a.iter().any(|&x| x != 0), "an all-zero id");
}

#[test]
fn an_nccl_group_runs_on_cuda_or_fails_at_once_naming_nccl() {
    let t0 = Instant::now();
    let g = nccl_group(Duration::from_secs(30));
    if !tch::Cuda::is_available() {
        let e = g.expect_err("an NCCL group without a GPU").to_string();
        eprintln!("no GPU: {e}");
        assert!(e.contains("nccl"), "{e}");
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "took {:?}",
            t0.elapsed()
        );
        return;
    }
    let g = g.unwrap();
    assert_eq!(g.device(), Device::Cuda(0));
    let mut t = Tensor::from_slice(&[1.0f32, -2.0, 3.5]).to_device(Device::Cuda(0));
    g.all_reduce(&mut t, ReduceOp::Sum).unwrap().wait().unwrap();
    assert_eq!(
        Vec::<f32>::try_from(t.to_device(Device::Cpu)).unwrap(),
        vec![1.0, -2.0, 3.5]
    );
    let mut b = Tensor::arange(6, (Kind::BFloat16, Device::Cuda(0)));
    g.broadcast(&mut b, 0).unwrap().wait().unwrap();
    assert_eq!(
        Vec::<f32>::try_from(b.to_kind(Kind::Float).to_device(Device::Cpu)).unwrap(),
        vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    );
    g.barrier().unwrap();
}

#[test]
fn a_raw_nccl_communicator_broadcasts_on_cuda_or_fails_at_once() {
    let mut comm = NcclComm::new(0);
    let id = WeightComm::unique_id(&mut comm).unwrap();
    let t0 = Instant::now();
    let joined = WeightComm::init(&mut comm, &id, 1);
    if !tch::Cuda::is_available() {
        let e = joined
            .expect_err("a communicator without a GPU")
            .to_string();
        eprintln!("no GPU: {e}");
        assert!(!e.is_empty());
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "took {:?}",
            t0.elapsed()
        );
        // No communicator was made: a broadcast says so rather than touching a null one.
        let e = WeightComm::broadcast(&mut comm, &Tensor::zeros([4], (Kind::Float, Device::Cpu)))
            .expect_err("a broadcast with no communicator")
            .to_string();
        assert!(e.contains("not initialised"), "{e}");
        return;
    }
    joined.unwrap();
    // One rank: the broadcast leaves the bytes as they are (and copies them to the device).
    let buf = Tensor::from_slice(&[7u8, 1, 2, 250]);
    WeightComm::broadcast(&mut comm, &buf).unwrap();
}
