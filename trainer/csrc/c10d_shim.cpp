// The trainer's c10d shim: extern "C" functions over torch's distributed engine (c10d), the one
// torch.distributed and FSDP use, for tch tensors. See c10d_shim.h for the contract: errors come
// back as heap strings; no C++ exception crosses the boundary.

#include "c10d_shim.h"
#include "c10d_types.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "gloo_decl.hpp"


namespace {

using rc10d::dup;
using rc10d::guard;

std::chrono::milliseconds ms(int64_t v) {
  return std::chrono::milliseconds(v);
}

at::Tensor& tensor_of(rc10d_tensor t) { return rc10d::tensor(t, "tensor"); }

c10d::ReduceOp reduce_op(int op) {
  switch (op) {
    case 0:
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case 3:
      return c10d::ReduceOp(c10d::ReduceOp::MIN);
    case 4:
      return c10d::ReduceOp(c10d::ReduceOp::MAX);
    default:
      throw std::invalid_argument("unsupported reduce op " + std::to_string(op));
  }
}

void check_pg(rc10d_pg* pg) {
  if (pg == nullptr || !pg->p) {
    throw std::invalid_argument("no process group");
  }
}

void hand_out(c10::intrusive_ptr<c10d::Work> w, rc10d_work** out) {
  *out = new rc10d_work{std::move(w)};
}

} // namespace

extern "C" {

void rc10d_free_error(char* err) {
  std::free(err);
}

void rc10d_free_bytes(uint8_t* bytes) {
  std::free(bytes);
}

char* rc10d_tcp_store_new(
    const char* host,
    uint16_t port,
    int is_server,
    int world,
    int64_t timeout_ms,
    rc10d_store** out,
    uint16_t* bound_port) {
  return guard([&] {
    c10d::TCPStoreOptions o;
    o.port = port;
    o.isServer = is_server != 0;
    o.numWorkers = static_cast<std::size_t>(world);
    o.waitWorkers = false;
    o.timeout = ms(timeout_ms);
    auto store = c10::make_intrusive<c10d::TCPStore>(std::string(host), o);
    if (bound_port != nullptr) {
      *bound_port = store->getPort();
    }
    *out = new rc10d_store{std::move(store)};
  });
}

char* rc10d_prefix_store_new(
    const char* prefix,
    rc10d_store* base,
    rc10d_store** out) {
  return guard([&] {
    if (base == nullptr) {
      throw std::invalid_argument("no store");
    }
    auto store = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), base->p);
    *out = new rc10d_store{std::move(store)};
  });
}

char* rc10d_store_set(
    rc10d_store* s,
    const char* key,
    const uint8_t* value,
    size_t n) {
  return guard([&] {
    if (s == nullptr) {
      throw std::invalid_argument("no store");
    }
    std::vector<uint8_t> v(value, value + n);
    s->p->set(std::string(key), v);
  });
}

char* rc10d_store_get(
    rc10d_store* s,
    const char* key,
    int64_t timeout_ms,
    uint8_t** value,
    size_t* n) {
  return guard([&] {
    if (s == nullptr) {
      throw std::invalid_argument("no store");
    }
    std::string k(key);
    s->p->wait({k}, ms(timeout_ms));
    auto v = s->p->get(k);
    auto* buf = static_cast<uint8_t*>(std::malloc(v.empty() ? 1 : v.size()));
    if (buf == nullptr) {
      throw std::bad_alloc();
    }
    if (!v.empty()) {
      std::memcpy(buf, v.data(), v.size());
    }
    *value = buf;
    *n = v.size();
  });
}

char* rc10d_store_delete(rc10d_store* s, const char* key) {
  return guard([&] {
    if (s == nullptr) {
      throw std::invalid_argument("no store");
    }
    s->p->deleteKey(std::string(key));
  });
}

void rc10d_store_free(rc10d_store* s) {
  try {
    delete s;
  } catch (...) {
  }
}

char* rc10d_gloo_new(
    rc10d_store* s,
    int rank,
    int world,
    const char* host,
    int threads,
    int64_t timeout_ms,
    rc10d_pg** out) {
  return guard([&] {
    if (s == nullptr) {
      throw std::invalid_argument("no store");
    }
    auto opts = c10d::ProcessGroupGloo::Options::create_default(ms(timeout_ms));
    if (host != nullptr) {
      opts->devices.clear();
      opts->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForHostname(std::string(host), false));
    }
    if (threads > 0) {
      opts->threads = threads;
    }
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(s->p, rank, world, opts);
    *out = new rc10d_pg{c10::static_intrusive_pointer_cast<c10d::Backend>(std::move(pg))};
  });
}

#ifndef RC10D_WITH_NCCL
char* rc10d_nccl_new(
    rc10d_store* /*s*/,
    int /*rank*/,
    int /*world*/,
    int /*device*/,
    int64_t /*timeout_ms*/,
    rc10d_pg** /*out*/) {
  return dup("this trainer was built without NCCL (cargo feature `nccl`)");
}
#endif

void rc10d_pg_free(rc10d_pg* pg) {
  try {
    delete pg;
  } catch (...) {
  }
}

char* rc10d_all_reduce(
    rc10d_pg* pg,
    rc10d_tensor t,
    int op,
    int64_t timeout_ms,
    rc10d_work** out) {
  return guard([&] {
    check_pg(pg);
    std::vector<at::Tensor> ts{tensor_of(t)};
    c10d::AllreduceOptions o;
    o.reduceOp = reduce_op(op);
    o.timeout = ms(timeout_ms);
    hand_out(pg->p->allreduce(ts, o), out);
  });
}

char* rc10d_reduce_scatter(
    rc10d_pg* pg,
    rc10d_tensor out,
    rc10d_tensor in,
    int op,
    int64_t timeout_ms,
    rc10d_work** w) {
  return guard([&] {
    check_pg(pg);
    c10d::ReduceScatterOptions o;
    o.reduceOp = reduce_op(op);
    o.timeout = ms(timeout_ms);
    at::Tensor o_t = tensor_of(out);
    at::Tensor i_t = tensor_of(in);
    hand_out(pg->p->_reduce_scatter_base(o_t, i_t, o), w);
  });
}

char* rc10d_all_gather(
    rc10d_pg* pg,
    rc10d_tensor out,
    rc10d_tensor in,
    int64_t timeout_ms,
    rc10d_work** w) {
  return guard([&] {
    check_pg(pg);
    c10d::AllgatherOptions o;
    o.timeout = ms(timeout_ms);
    at::Tensor o_t = tensor_of(out);
    at::Tensor i_t = tensor_of(in);
    hand_out(pg->p->_allgather_base(o_t, i_t, o), w);
  });
}

char* rc10d_broadcast(
    rc10d_pg* pg,
    rc10d_tensor t,
    int root,
    int64_t timeout_ms,
    rc10d_work** w) {
  return guard([&] {
    check_pg(pg);
    std::vector<at::Tensor> ts{tensor_of(t)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.rootTensor = 0;
    o.timeout = ms(timeout_ms);
    hand_out(pg->p->broadcast(ts, o), w);
  });
}

char* rc10d_barrier(rc10d_pg* pg, int64_t timeout_ms, rc10d_work** w) {
  return guard([&] {
    check_pg(pg);
    c10d::BarrierOptions o;
    o.timeout = ms(timeout_ms);
    hand_out(pg->p->barrier(o), w);
  });
}

char* rc10d_work_wait(rc10d_work* w, int64_t timeout_ms) {
  return guard([&] {
    if (w == nullptr || !w->p) {
      throw std::invalid_argument("no work");
    }
    w->p->wait(ms(timeout_ms));
  });
}

void rc10d_work_free(rc10d_work* w) {
  try {
    delete w;
  } catch (...) {
  }
}

char* rc10d_set_grad(rc10d_tensor t, rc10d_tensor grad) {
  return guard([&] {
    at::Tensor& p = tensor_of(t);
    const at::Tensor& g = tensor_of(grad);
    if (!g.defined() || g.sizes() != p.sizes()) {
      throw std::invalid_argument("a gradient must have its parameter's shape");
    }
    p.mutable_grad() = g;
  });
}

} // extern "C"
