/* C ABI of the trainer's libtorch kernels that tch does not bind (kernels.cpp). Same contract
 * as c10d_shim.h: NULL on success or a heap error message freed with rc10d_free_error; no C++
 * exception crosses the boundary; a tensor is tch's C_tensor (a `torch::Tensor *`). */
#ifndef RTORCH_KERNELS_H
#define RTORCH_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* torch._fused_adamw_ (the kernel of torch.optim.AdamW(fused=True)) over n parameters, in
 * place: params[i], exp_avgs[i] and exp_avg_sqs[i] are updated in one pass over each element,
 * with 1-based optimizer step `step` (bias corrections) and decoupled weight decay
 * p *= 1 - lr * weight_decay. grads[i] is read only. Every quadruple shares shape, dtype and
 * device, and all lie on one device. Runs with autograd off. */
char *rtorch_fused_adamw(void *const *params, void *const *grads, void *const *exp_avgs,
                         void *const *exp_avg_sqs, size_t n, double step, double lr,
                         double beta1, double beta2, double weight_decay, double eps);

/* at::parallel_for over [0, n) with a grain of 1: f(ctx, begin, end) for disjoint chunks that
 * cover the range, on libtorch's intra-op threads (the calling thread among them), returning
 * once every chunk has ended. f must not unwind. */
char *rtorch_parallel_for(int64_t n, void (*f)(void *, int64_t, int64_t), void *ctx);

/* Causal attention of queries q [B, H, T, D] that follow P positions every row sees: each query
 * attends to all of kp/vp [B, Hkv, P, D] and to ko/vo [B, Hkv, T, D] up to its own position
 * (H a multiple of Hkv; libtorch's flash kernel for CPU tensors, scale 1/sqrt(D)). One autograd
 * node: gradients reach q, kp, vp, ko and vo when they require them. *out receives a new
 * tensor (a `torch::Tensor *` the caller owns) on success. */
char *rtorch_prefix_causal_attention(void *q, void *kp, void *vp, void *ko, void *vo,
                                     void **out);

/* Exact causal attention in bf16 on the CPU (attention.cpp): queries q [B, H, T, D] at
 * positions past..past+T-1, keys and values k, v [B, Hkv, past + T, D]; query i sees keys
 * 0..past+i (H a multiple of Hkv, D a multiple of 64, scale 1/sqrt(D)). One autograd node.
 * Only the 256-key chunks each 48-query strip sees are computed, with AVX512-BF16 dot
 * products where the CPU has them; `portable` != 0 forces the portable path (same arithmetic,
 * slow). *out receives a new tensor the caller owns on success. */
char *rtorch_causal_attention(void *q, void *k, void *v, int64_t past, int portable,
                              void **out);

/* 1 when rtorch_causal_attention runs on AVX512-BF16 here, else 0. */
int rtorch_causal_attention_fast(void);

#ifdef __cplusplus
}
#endif

#endif
