// NCCL process groups for the c10d shim (cargo feature `nccl`), built against the CUDA and NCCL
// headers the CUDA torch wheel and scripts/requirements-cuda.txt bring (trainer/build.rs); CI
// builds it and runs trainer/tests/nccl.rs without a GPU. The collectives themselves are the
// generic c10d::Backend calls of c10d_shim.cpp.

#include "c10d_shim.h"
#include "c10d_types.hpp"

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>


extern "C" char* rc10d_nccl_new(
    rc10d_store* s,
    int rank,
    int world,
    int device,
    int64_t timeout_ms,
    rc10d_pg** out) {
  return rc10d::guard([&] {
    if (s == nullptr) {
      throw std::invalid_argument("no store");
    }
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = std::chrono::milliseconds(timeout_ms);
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(s->p, rank, world, opts);
    // Connect now, so a missing peer fails here rather than in the first collective.
    pg->eagerConnectSingleDevice(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
    *out = new rc10d_pg{c10::static_intrusive_pointer_cast<c10d::Backend>(std::move(pg))};
  });
}

// ---------------------------------------------------------------------------------------------
// A raw NCCL communicator for vLLM's weight-transfer route (trainer/src/dist/vllm.rs): vLLM's
// workers join with `ncclCommInitRank` on the unique id this side publishes, so the group is
// raw NCCL, not a c10d process group. Collectives run on the current CUDA stream of the
// communicator's device and are waited for before returning.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

namespace {

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
  }
}

struct rc10d_raw_nccl {
  ncclComm_t comm;
  int device;
};

}  // namespace

extern "C" char* rc10d_nccl_unique_id(unsigned char* out) {
  return rc10d::guard([&] {
    ncclUniqueId id;
    nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    static_assert(sizeof(id.internal) == 128, "ncclUniqueId is 128 bytes");
    std::memcpy(out, id.internal, 128);
  });
}

extern "C" char* rc10d_nccl_comm_init(
    const unsigned char* id_bytes,
    int world,
    int rank,
    int device,
    void** out) {
  return rc10d::guard([&] {
    c10::cuda::CUDAGuard g(static_cast<c10::DeviceIndex>(device));
    ncclUniqueId id;
    std::memcpy(id.internal, id_bytes, 128);
    ncclComm_t comm;
    nccl_check(ncclCommInitRank(&comm, world, id, rank), "ncclCommInitRank");
    // vLLM's warm-up: an all-reduce of one f32 zero.
    auto t = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device));
    auto stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
    nccl_check(
        ncclAllReduce(t.data_ptr(), t.data_ptr(), 1, ncclFloat, ncclSum, comm, stream.stream()),
        "warm-up ncclAllReduce");
    stream.synchronize();
    *out = new rc10d_raw_nccl{comm, device};
  });
}

extern "C" char* rc10d_nccl_comm_broadcast(void* comm, void* tensor, int root) {
  return rc10d::guard([&] {
    if (comm == nullptr || tensor == nullptr) {
      throw std::invalid_argument("null communicator or tensor");
    }
    auto* c = static_cast<rc10d_raw_nccl*>(comm);
    auto& t = *static_cast<at::Tensor*>(tensor);
    if (!t.is_cuda() || !t.is_contiguous()) {
      throw std::invalid_argument("the broadcast buffer must be a contiguous CUDA tensor");
    }
    c10::cuda::CUDAGuard g(static_cast<c10::DeviceIndex>(c->device));
    auto stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(c->device));
    nccl_check(
        ncclBroadcast(
            t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.nbytes()), ncclUint8, root,
            c->comm, stream.stream()),
        "ncclBroadcast");
    stream.synchronize();
  });
}

extern "C" void rc10d_nccl_comm_free(void* comm) {
  if (comm != nullptr) {
    auto* c = static_cast<rc10d_raw_nccl*>(comm);
    ncclCommDestroy(c->comm);
    delete c;
  }
}

// ---------------------------------------------------------------------------------------------
// The CUDA caching allocator's peak of allocated bytes on `device` since the last reset (what
// torch.cuda.max_memory_allocated reports), for `trainer bench`; `reset` starts a new peak.
// -1 when the allocator cannot answer (no such device).

#include <c10/cuda/CUDACachingAllocator.h>

extern "C" int64_t rc10d_cuda_peak_allocated(int device, int reset) {
  try {
    auto idx = static_cast<c10::DeviceIndex>(device);
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(idx);
    auto peak = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
    if (reset != 0) {
      c10::cuda::CUDACachingAllocator::resetPeakStats(idx);
    }
    return peak;
  } catch (...) {
    return -1;
  }
}
