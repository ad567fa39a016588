//! The trainer on a GPU (the `nccl` build, which links libtorch_cuda, the CUDA runtime and
//! NCCL). scripts/device-check.sh runs this file on a machine with a GPU and sets
//! RUBRICEM_REQUIRE_CUDA=1, so that a machine without one fails it; elsewhere each test says
//! it did not run (CI lints it but runs only tests/nccl.rs). RUBRICEM_TEST_DEVICE=cpu runs the
//! same code with CPU in the GPU's place, which checks the tests themselves.
//! - A train step on the GPU equals the CPU step on the same fp32 weights and batch, for every
//!   data-parallel case (full fine-tune and LoRA, with and without gradient checkpointing,
//!   SS-GRPO, SFT, the reflection update, two PPO minibatches).
//! - A bf16 full fine-tune on the GPU at lr 5e-7 moves as the fp32 reference (master weights).
//! - Two ranks sharing the one GPU over NCCL: NCCL refuses a communicator with two ranks on one
//!   device; both ranks must end within the timeout with an error naming NCCL (or, should NCCL
//!   accept it, train as one process on the whole batch, plain and with ZeRO-1 and ZeRO-2).
//! - Two ranks sharing the one GPU over gloo, whose collectives take CUDA tensors (staged
//!   through pinned host memory): the collectives give the hand-computed values on the GPU,
//!   and the ranks train as one process on the whole batch, plain and with ZeRO-1 and ZeRO-2.
//!   This is the multi-rank path on CUDA tensors that NCCL takes on several GPUs (the same
//!   trainer code; only the group's transport differs), the most of it one GPU can run.
//! - The HTTP service suite (tests/serve_suite) on a policy held on the GPU.
#![cfg(feature = "nccl")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
// Only the suite's functions are used here, not its test-defining macro.
#[allow(unused_macros, unused_imports)]
mod serve_suite;

use std::time::Duration;

use common::cases::{
    CASES, Tolerance, batch, bf16_follows_fp32, dp_and_zero_cases_agree, step, steps_agree,
    trainer_on,
};
use common::ranks::{
    Spawn, assert_ranks_passed, child_env, collectives_give_hand_computed_values, join, join_on,
    run_ranks,
};
use serve_suite::Launch;
use tch::{Device, Tensor};
use trainer::dist::{BackendKind, Collective, ReduceOp};

const CHILD: &str = "RUBRICEM_CUDA_TEST_CHILD";

/// The device standing for the GPU: CUDA device 0, or CPU under RUBRICEM_TEST_DEVICE=cpu.
/// `None` (the test does not run, and says so) where there is no GPU, unless
/// RUBRICEM_REQUIRE_CUDA is set, which makes that a failure.
fn gpu(test: &str) -> Option<Device> {
    if std::env::var("RUBRICEM_TEST_DEVICE").ok().as_deref() == Some("cpu") {
        return Some(Device::Cpu);
    }
    if tch::Cuda::is_available() {
        return Some(Device::Cuda(0));
    }
    assert!(
        std::env::var_os("RUBRICEM_REQUIRE_CUDA").is_none(),
        "{test}: RUBRICEM_REQUIRE_CUDA is set but torch sees no CUDA device"
    );
    eprintln!("{test}: no CUDA device; not run");
    None
}

#[test]
fn a_gpu_step_equals_the_cpu_step() {
    let Some(dev) = gpu("a_gpu_step_equals_the_cpu_step") else {
        return;
    };
    // Different kernels sum in different orders: fp32 agreement, not bitwise.
    let tol = Tolerance {
        rel: 1e-4,
        abs: 0.0,
    };
    for c in CASES {
        let seqs = batch(c.sequences);
        let mut cpu = trainer_on(&c, Device::Cpu);
        let mut on_gpu = trainer_on(&c, dev);
        assert_eq!(on_gpu.model.device, dev);
        for k in 0..2 {
            let want = step(&mut cpu, &c, &seqs);
            let got = step(&mut on_gpu, &c, &seqs);
            let worst = steps_agree(
                &format!("{c:?} step {k}"),
                (&got, &on_gpu),
                (&want, &cpu),
                true,
                tol,
            );
            eprintln!("{c:?} step {k}: ok (largest relative difference {worst:.2e})");
        }
    }
}

#[test]
fn bf16_on_the_gpu_follows_the_fp32_reference_at_a_tiny_learning_rate() {
    if let Some(dev) = gpu("bf16_on_the_gpu_follows_the_fp32_reference_at_a_tiny_learning_rate") {
        bf16_follows_fp32(dev);
    }
}

/// Two ranks on the one device.
fn two_on_one(name: &str) -> Vec<std::process::Output> {
    let spawn = Spawn {
        child_var: CHILD,
        one_device: true,
    };
    run_ranks(spawn, name, 2, Duration::from_secs(180))
}

#[test]
fn two_ranks_sharing_the_gpu_over_nccl_fail_at_once_naming_nccl_or_train_as_one() {
    let Some(dev) = gpu("two_ranks_sharing_the_gpu_over_nccl") else {
        return;
    };
    if dev == Device::Cpu {
        eprintln!("NCCL needs a GPU; not run under RUBRICEM_TEST_DEVICE=cpu");
        return;
    }
    let t0 = std::time::Instant::now();
    let outs = two_on_one("rank_nccl_on_one_gpu");
    eprintln!("two NCCL ranks on one GPU ended after {:?}", t0.elapsed());
    assert_ranks_passed("rank_nccl_on_one_gpu", &outs);
    let said =
        |o: &std::process::Output, what: &str| String::from_utf8_lossy(&o.stderr).contains(what);
    let refused = outs.iter().filter(|o| said(o, "NCCL refused -> ")).count();
    let trained = outs.iter().filter(|o| said(o, "NCCL trained")).count();
    // Both ranks see the same outcome.
    assert!(
        (refused, trained) == (2, 0) || (refused, trained) == (0, 2),
        "refused on {refused} ranks, trained on {trained}"
    );
}

#[test]
fn rank_nccl_on_one_gpu() {
    let Some(env) = child_env(CHILD, "rank_nccl_on_one_gpu") else {
        return;
    };
    let dev = gpu("rank_nccl_on_one_gpu").unwrap();
    let timeout = Duration::from_secs(60);
    let t0 = std::time::Instant::now();
    // The shim connects the communicator as the group is made (eagerConnectSingleDevice), so
    // NCCL's refusal comes from the join; the all-reduce runs only if NCCL accepts the group.
    let outcome = join(&env, BackendKind::Nccl, timeout).and_then(|g| {
        let mut t = Tensor::from_slice(&[1.0f32, env.rank as f32]).to_device(dev);
        g.all_reduce(&mut t, trainer::dist::ReduceOp::Sum)?.wait()?;
        let v = Vec::<f32>::try_from(t.to_device(Device::Cpu)).unwrap();
        assert_eq!(v, vec![2.0, 1.0]);
        Ok(g)
    });
    match outcome {
        Err(e) => {
            let msg = e.to_string();
            eprintln!("NCCL refused -> {msg} (after {:?})", t0.elapsed());
            assert!(msg.to_lowercase().contains("nccl"), "{msg}");
            assert!(t0.elapsed() < timeout * 2, "took {:?}", t0.elapsed());
        }
        Ok(g) => {
            // Every case, plain data parallel then ZeRO-1 and ZeRO-2.
            dp_and_zero_cases_agree(Box::new(g), dev);
            eprintln!("NCCL trained -> two ranks on one GPU");
        }
    }
}

#[test]
fn two_ranks_sharing_the_gpu_over_gloo_train_as_one() {
    if gpu("two_ranks_sharing_the_gpu_over_gloo_train_as_one").is_none() {
        return;
    }
    let t0 = std::time::Instant::now();
    let outs = two_on_one("rank_gloo_on_one_gpu");
    eprintln!("two gloo ranks on one GPU ended after {:?}", t0.elapsed());
    assert_ranks_passed("rank_gloo_on_one_gpu", &outs);
}

#[test]
fn rank_gloo_on_one_gpu() {
    let Some(env) = child_env(CHILD, "rank_gloo_on_one_gpu") else {
        return;
    };
    let dev = gpu("rank_gloo_on_one_gpu").unwrap();
    let g = join_on(&env, BackendKind::Gloo, dev, Duration::from_secs(120)).unwrap();
    assert_eq!(g.backend(), "gloo");
    // The collectives the trainer uses, on the device, with hand-computed values.
    collectives_give_hand_computed_values(&g, dev);
    // A CPU tensor is refused before anything is sent (where the device is not the CPU).
    if dev != Device::Cpu {
        let mut cpu = Tensor::from_slice(&[1.0f32]);
        let e = g.all_reduce(&mut cpu, ReduceOp::Sum).unwrap_err();
        assert!(e.to_string().contains("Cuda"), "{e}");
    }
    g.barrier().unwrap();
    // Every case, plain data parallel then ZeRO-1 and ZeRO-2, against one process on the
    // whole batch on the same device.
    dp_and_zero_cases_agree(Box::new(g), dev).barrier().unwrap();
    eprintln!("gloo trained -> two ranks on {dev:?}");
}

/// The service suite on a policy held on the GPU (in-process, one server).
macro_rules! on_the_gpu {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            if let Some(dev) = gpu(stringify!($name)) {
                serve_suite::$name(Launch::InProcessOn(dev)).await;
            }
        }
    )*};
}

on_the_gpu!(
    generation_through_the_orchestrator_client_matches_the_forward_pass,
    train_steps_over_http_follow_the_advantage_sign_and_refuse_concurrency,
    publishing_records_exact_calls_and_keeps_the_previous_version_on_failure,
    checkpoint_restart_next_step_equals_a_run_that_never_stopped,
    a_policy_server_receives_published_full_weights_and_the_restored_policy,
    settings_are_applied_echoed_and_checked_on_every_step,
    a_request_extending_a_finished_one_reuses_its_keys_and_values,
);
