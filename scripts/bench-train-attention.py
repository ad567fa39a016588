#!/usr/bin/env python3
"""Causal attention of a training step on CPU, forward and backward: libtorch's flash kernel as
the trainer calls it against exact causal query strips whose block products go through
`torch.matmul`, and, for rows after a shared prefix, the zero queries the trainer ran before
session 87 against its two flash calls merged by their log-sum-exps (issue 25 item 4,
BENCHMARKS.md session 87).

libtorch's CPU flash kernel walks 256-query blocks over 512-key blocks and computes a diagonal
block whole, so causal attention costs more than half of full attention (the printed
`causal / full`; an exact triangle would be 0.5). Rows' own positions after a shared prefix of
`past` positions ran with `past` zero queries before them, which the kernel computes too; on
CPU the trainer now runs them as two flash calls, the prefix's keys in full and the own keys
causally (`kernels::prefix_causal_attention`, mirrored by `prefix_split` below). The strips
compute, for each strip of queries, the scores of exactly the keys it sees (the last
strip-by-strip triangle aside), with a hand-written backward (recomputed scores from the
forward's log-sum-exp); both are checked against SDPA's output and gradients first. The ratios
say whether removing each waste pays.

    usage: OMP_NUM_THREADS=1 scripts/bench-train-attention.py [--dtype float32|bfloat16]
           [--threads 1] [--strips 64,128,256]
Shapes are the smoke model's (4 query heads over 2 key/value heads of 64) at the `guided`
trajectories' lengths. Run with scripts/torch-env.sh sourced (the venv's torch).
"""
import argparse
import math
import time

import torch


def strips(t, bq):
    return [(r0, min(r0 + bq, t)) for r0 in range(0, t, bq)]


def strip_scores(qs, k, past, r0, r1, scale):
    """Scores of the queries r0..r1 (at positions past + r0 ..) over the keys they see."""
    e = past + r1
    n = r1 - r0
    s = torch.matmul(qs, k[:, :, None, :e].transpose(-1, -2)) * scale
    tri = torch.ones(n, n, dtype=torch.bool).triu(1)
    s[..., e - n :].masked_fill_(tri, float("-inf"))
    return s


class StripAttention(torch.autograd.Function):
    """q [B, Hkv, g, T, D] (g query heads a key/value head), k and v [B, Hkv, past + T, D]."""

    @staticmethod
    def forward(ctx, q, k, v, past, bq):
        b, hkv, g, t, d = q.shape
        scale = 1.0 / math.sqrt(d)
        out = torch.empty_like(q)
        lse = torch.empty(b, hkv, g, t, dtype=torch.float32)
        for r0, r1 in strips(t, bq):
            s = strip_scores(q[:, :, :, r0:r1], k, past, r0, r1, scale).float()
            ls = torch.logsumexp(s, -1, keepdim=True)
            p = torch.exp(s - ls).to(q.dtype)
            out[:, :, :, r0:r1] = torch.matmul(p, v[:, :, None, : past + r1])
            lse[:, :, :, r0:r1] = ls.squeeze(-1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.past, ctx.bq = past, bq
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        past, bq = ctx.past, ctx.bq
        b, hkv, g, t, d = q.shape
        scale = 1.0 / math.sqrt(d)
        dq = torch.empty_like(q)
        dk = torch.zeros_like(k)
        dv = torch.zeros_like(v)
        dvec = (do.float() * out.float()).sum(-1, keepdim=True)
        for r0, r1 in strips(t, bq):
            e, n = past + r1, r1 - r0
            qs, dos = q[:, :, :, r0:r1], do[:, :, :, r0:r1]
            s = strip_scores(qs, k, past, r0, r1, scale).float()
            p = torch.exp(s - lse[:, :, :, r0:r1, None])
            dv[:, :, :e] += torch.matmul(
                p.to(q.dtype).reshape(b, hkv, g * n, e).transpose(-1, -2),
                dos.reshape(b, hkv, g * n, d),
            )
            dp = torch.matmul(dos, v[:, :, None, :e].transpose(-1, -2)).float()
            ds = (p * (dp - dvec[:, :, :, r0:r1]) * scale).to(q.dtype)
            dq[:, :, :, r0:r1] = torch.matmul(ds, k[:, :, None, :e])
            dk[:, :, :e] += torch.matmul(
                ds.reshape(b, hkv, g * n, e).transpose(-1, -2), qs.reshape(b, hkv, g * n, d)
            )
        return dq, dk, dv, None, None


def strip_attention(q, k, v, past, bq):
    b, h, t, d = q.shape
    hkv = k.shape[1]
    out = StripAttention.apply(q.view(b, hkv, h // hkv, t, d), k, v, past, bq)
    return out.view(b, h, t, d)


def trainer_path(q, k, v, past):
    """What `Qwen3::attention` ran before session 87 (and runs on CUDA): `past` zero queries
    before the rows' own, causal flash."""
    b, h, _, d = q.shape
    qp = torch.cat([torch.zeros(b, h, past, d, dtype=q.dtype), q], 2) if past else q
    y = torch.nn.functional.scaled_dot_product_attention(
        qp, k, v, is_causal=True, enable_gqa=True
    )
    return y[:, :, past:]


F = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
FB = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class PrefixSplit(torch.autograd.Function):
    """What `kernels::prefix_causal_attention` runs: the prefix's keys in full and the own keys
    causally, merged by their log-sum-exps; the backward is both flash backwards given the
    merged output and log-sum-exp."""

    @staticmethod
    def forward(ctx, q, kp, vp, ko, vo):
        o1, l1 = F(q, kp, vp, 0.0, False)
        o2, l2 = F(q, ko, vo, 0.0, True)
        lse = torch.logaddexp(l1, l2)
        o = torch.exp(l1 - lse)[..., None] * o1.float()
        o = (o + torch.exp(l2 - lse)[..., None] * o2.float()).to(q.dtype)
        ctx.save_for_backward(q, kp, vp, ko, vo, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        q, kp, vp, ko, vo, o, lse = ctx.saved_tensors
        do = do.contiguous()
        dq1, dkp, dvp = FB(do, q, kp, vp, o, lse, 0.0, False)
        dq2, dko, dvo = FB(do, q, ko, vo, o, lse, 0.0, True)
        return dq1 + dq2, dkp, dvp, dko, dvo


def prefix_split(q, k, v, past):
    t = q.shape[2]
    return PrefixSplit.apply(q, k[:, :, :past], v[:, :, :past], k[:, :, past:], v[:, :, past:])


def fwd_bwd(fn, q, k, v, do):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    y = fn(q, k, v)
    y.backward(do)
    return y.detach(), q.grad, k.grad, v.grad


def best_of(fn, reps=3):
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def inputs(b, t, past, dtype, h=4, hkv=2, d=64):
    def r(*shape):
        return torch.randn(*shape, dtype=dtype)

    return r(b, h, t, d), r(b, hkv, past + t, d), r(b, hkv, past + t, d), r(b, h, t, d)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--strips", default="64,128,256")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, a.dtype)
    sizes = [int(x) for x in a.strips.split(",")]
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for b, t, past in [(1, 300, 0), (2, 300, 100)]:
        q, k, v, do = inputs(b, t, past, dtype)
        ref = fwd_bwd(lambda q, k, v: trainer_path(q, k, v, past), q, k, v, do)
        for name, fn in [("strips", lambda q, k, v: strip_attention(q, k, v, past, 64)),
                         ("the prefix split", lambda q, k, v: prefix_split(q, k, v, past))]:
            if name != "strips" and past == 0:
                continue
            got = fwd_bwd(fn, q, k, v, do)
            err = max(float((x - y).abs().max() / x.abs().max()) for x, y in zip(ref, got))
            if not err < tol:
                raise SystemExit(f"{name} differs from SDPA by {err:.2e} (limit {tol:.0e})")
    print(f"strips and the prefix split equal SDPA (output and gradients) within {tol:.0e}; "
          f"{a.dtype}, {a.threads} thread(s), best of 3, forward and backward")
    for t in (2000, 3000):
        q, k, v, do = inputs(1, t, 0, dtype)
        causal = best_of(lambda: fwd_bwd(lambda q, k, v: trainer_path(q, k, v, 0), q, k, v, do))
        full = best_of(
            lambda: fwd_bwd(
                lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, enable_gqa=True
                ),
                q, k, v, do,
            )
        )
        print(f"T={t}: flash causal {causal * 1e3:.0f} ms, full {full * 1e3:.0f} ms, "
              f"causal / full {causal / full:.3f} (exact triangle 0.5)")
    for b, t, past in [(1, 2000, 0), (1, 3000, 0), (6, 1250, 700)]:
        q, k, v, do = inputs(b, t, past, dtype)
        ref = best_of(lambda: fwd_bwd(lambda q, k, v: trainer_path(q, k, v, past), q, k, v, do))
        line = f"B={b} T={t} past={past}: trainer's flash {ref * 1e3:.0f} ms"
        for bq in sizes:
            got = best_of(
                lambda: fwd_bwd(lambda q, k, v: strip_attention(q, k, v, past, bq), q, k, v, do)
            )
            line += f" | strips of {bq} {got * 1e3:.0f} ms ({ref / got:.2f}x)"
        print(line, flush=True)
    for b, t, past in [(4, 1250, 700), (6, 1250, 700), (8, 900, 700), (4, 2300, 700)]:
        q, k, v, do = inputs(b, t, past, dtype)
        ref = best_of(lambda: fwd_bwd(lambda q, k, v: trainer_path(q, k, v, past), q, k, v, do))
        got = best_of(lambda: fwd_bwd(lambda q, k, v: prefix_split(q, k, v, past), q, k, v, do))
        print(f"B={b} T={t} after {past} shared: zero queries {ref * 1e3:.0f} ms, "
              f"two flash calls {got * 1e3:.0f} ms ({ref / got:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
