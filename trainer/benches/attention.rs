//! A training step's causal attention on the CPU in bf16, forward and backward, at the smoke
//! model's shapes (4 query heads over 2 key/value heads of 64) and the `guided` trajectories'
//! lengths: the reference, what `Qwen3::attention` runs on libtorch (its flash kernel, causal;
//! after a shared prefix, `kernels::prefix_causal_attention`'s two flash calls), against the
//! trainer's own exact causal kernel (`kernels::causal_attention`, AVX512-BF16 dot products),
//! best of three, with the ratio (BENCHMARKS.md, issue 25 session 88). On a CPU without
//! AVX512-BF16 the own kernel is not used and the bench says so. Run:
//! `cargo bench -p trainer --bench attention` after `source scripts/torch-env.sh`, one thread
//! as the trainer runs beside a policy server (`OMP_NUM_THREADS=1 taskset -c 0`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::Instant;

use tch::{Device, Kind, Tensor};

/// Seconds of one forward and backward of `attend` (the best of three after a warm-up).
fn time(attend: &dyn Fn(&Tensor, &Tensor, &Tensor) -> Tensor, x: &[Tensor; 4]) -> f64 {
    let run = || {
        let q = x[0].detach().set_requires_grad(true);
        let k = x[1].detach().set_requires_grad(true);
        let v = x[2].detach().set_requires_grad(true);
        let t0 = Instant::now();
        let y = attend(&q, &k, &v);
        (&y * &x[3]).sum(Kind::Float).backward();
        let _ = (q.grad(), k.grad(), v.grad());
        t0.elapsed().as_secs_f64()
    };
    run();
    (0..3).map(|_| run()).fold(f64::INFINITY, f64::min)
}

fn main() {
    if !trainer::kernels::own_causal_attention(Kind::BFloat16, Device::Cpu, 64) {
        println!("no AVX512-BF16 on this CPU: bf16 causal attention stays on libtorch's kernel");
        return;
    }
    println!(
        "causal attention, bf16, forward + backward, {} thread(s), best of 3",
        tch::get_num_threads()
    );
    tch::manual_seed(3);
    for (b, t, past) in [(1, 2000, 0), (1, 3000, 0), (6, 1250, 700), (4, 2300, 700)] {
        let r = |h: i64, n: i64| Tensor::randn([b, h, n, 64], (Kind::BFloat16, Device::Cpu));
        let x = [r(4, t), r(2, past + t), r(2, past + t), r(4, t)];
        let libtorch = time(
            &|q, k, v| {
                if past == 0 {
                    Tensor::scaled_dot_product_attention(
                        q,
                        k,
                        v,
                        None::<Tensor>,
                        0.0,
                        true,
                        None,
                        true,
                    )
                } else {
                    trainer::kernels::prefix_causal_attention(q, k, v, past).unwrap()
                }
            },
            &x,
        );
        let own = time(
            &|q, k, v| trainer::kernels::causal_attention(q, k, v, past).unwrap(),
            &x,
        );
        println!(
            "B={b} T={t} past={past}: libtorch {:.0} ms | own {:.0} ms ({:.2}x)",
            libtorch * 1e3,
            own * 1e3,
            libtorch / own
        );
    }
}
