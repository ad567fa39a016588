// The trainer's libtorch kernels that tch does not bind (see kernels.h): the fused AdamW
// update, and libtorch's intra-op parallel loop for the CPU decode kernel. Errors come back as
// heap strings through the c10d shim's guard.

#include "kernels.h"
#include "c10d_types.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ops/_fused_adamw.h>

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

}  // namespace

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
