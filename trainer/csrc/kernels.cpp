// The trainer's libtorch kernels that tch does not bind (see kernels.h): the fused AdamW
// update, libtorch's intra-op parallel loop for the CPU decode kernel, and causal attention of
// queries after a prefix as two flash calls with one autograd node. Errors come back as heap
// strings through the c10d shim's guard.

#include "kernels.h"
#include "c10d_types.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <torch/csrc/autograd/custom_function.h>

namespace {

std::vector<at::Tensor> tensors(void* const* ts, size_t n, const char* what) {
  if (n > 0 && ts == nullptr) {
    throw std::invalid_argument(std::string("null ") + what + " list");
  }
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (ts[i] == nullptr) {
      throw std::invalid_argument(std::string("null tensor in ") + what + " at " +
                                  std::to_string(i));
    }
    // A new reference to the same storage: the kernel writes through it.
    out.push_back(*static_cast<at::Tensor*>(ts[i]));
  }
  return out;
}

// Queries at positions past.. (one a row of ko/vo) attend to every prefix position (kp/vp) and
// causally to their own: softmax over [prefix; own] as two partial attentions merged by their
// log-sum-exps. The backward runs libtorch's flash backward over each part with the merged
// output and log-sum-exp, which gives each part's keys the gradient of the one softmax (the
// row term of the flash backward is rowsum(dO * O) of the whole attention) and the queries the
// sum of both parts'. Exact up to rounding; no position of either part is computed twice.
struct PrefixCausal : public torch::autograd::Function<PrefixCausal> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& kp, const at::Tensor& vp, const at::Tensor& ko,
                            const at::Tensor& vo) {
    auto [o1, l1] = at::_scaled_dot_product_flash_attention_for_cpu(q, kp, vp, 0.0, false);
    auto [o2, l2] = at::_scaled_dot_product_flash_attention_for_cpu(q, ko, vo, 0.0, true);
    auto l = at::logaddexp(l1, l2);
    auto o = (at::exp(l1 - l).unsqueeze(-1) * o1.to(at::kFloat) +
              at::exp(l2 - l).unsqueeze(-1) * o2.to(at::kFloat))
                 .to(q.scalar_type());
    ctx->save_for_backward({q, kp, vp, ko, vo, o, l});
    return o;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto s = ctx->get_saved_variables();
    if (!grads[0].defined()) {
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    auto d = grads[0].contiguous();
    auto [dq1, dkp, dvp] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        d, s[0], s[1], s[2], s[5], s[6], 0.0, false);
    auto [dq2, dko, dvo] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        d, s[0], s[3], s[4], s[5], s[6], 0.0, true);
    return {dq1 + dq2, dkp, dvp, dko, dvo};
  }
};

}  // namespace

extern "C" char* rtorch_prefix_causal_attention(void* q, void* kp, void* vp, void* ko, void* vo,
                                                void** out) {
  return rc10d::guard([&] {
    if (out == nullptr) {
      throw std::invalid_argument("null output slot");
    }
    using rc10d::tensor;
    auto y = PrefixCausal::apply(tensor(q, "query"), tensor(kp, "prefix key"),
                                 tensor(vp, "prefix value"), tensor(ko, "own key"),
                                 tensor(vo, "own value"));
    *out = new at::Tensor(std::move(y));
  });
}

extern "C" char* rtorch_parallel_for(int64_t n, void (*f)(void*, int64_t, int64_t),
                                     void* ctx) {
  return rc10d::guard([&] {
    if (f == nullptr) {
      throw std::invalid_argument("null parallel_for body");
    }
    at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) { f(ctx, begin, end); });
  });
}

extern "C" char* rtorch_fused_adamw(void* const* params, void* const* grads,
                                    void* const* exp_avgs, void* const* exp_avg_sqs, size_t n,
                                    double step, double lr, double beta1, double beta2,
                                    double weight_decay, double eps) {
  return rc10d::guard([&] {
    if (n == 0) {
      return;
    }
    at::NoGradGuard no_grad;
    auto p = tensors(params, n, "params");
    auto g = tensors(grads, n, "grads");
    auto m = tensors(exp_avgs, n, "exp_avgs");
    auto v = tensors(exp_avg_sqs, n, "exp_avg_sqs");
    // The kernel reads each parameter's step from a one-element fp32 tensor on its device
    // (PyTorch keeps one per parameter and increments it before the call); views of one
    // tensor cost one allocation instead of n.
    auto all = at::full({static_cast<int64_t>(n)}, step, p[0].options().dtype(at::kFloat));
    std::vector<at::Tensor> steps;
    steps.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      steps.push_back(all.select(0, static_cast<int64_t>(i)));
    }
    at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2, weight_decay,
                      eps, /*amsgrad=*/false, /*maximize=*/false);
  });
}
