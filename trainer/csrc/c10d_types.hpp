// The shim's handle types (opaque to Rust), its error guard and its view of a tch tensor,
// shared by c10d_shim.cpp, nccl_shim.cpp, kernels.cpp and attention.cpp.
#pragma once

#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

struct rc10d_store {
  c10::intrusive_ptr<c10d::Store> p;
};
struct rc10d_pg {
  c10::intrusive_ptr<c10d::Backend> p;
};
struct rc10d_work {
  c10::intrusive_ptr<c10d::Work> p;
};

namespace rc10d {

// A heap copy of `s` for Rust (freed with rc10d_free_error).
inline char* dup(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, s.c_str(), s.size() + 1);
  }
  return out;
}

// The first line of a c10 error (the rest is a C++ backtrace).
inline std::string first_line(const char* what) {
  std::string s(what == nullptr ? "" : what);
  auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

// The tensor behind a tch C_tensor (a `torch::Tensor *`); a null one is refused as "null
// <what>".
inline at::Tensor& tensor(void* t, const char* what) {
  if (t == nullptr) {
    throw std::invalid_argument(std::string("null ") + what);
  }
  return *static_cast<at::Tensor*>(t);
}

// Run `f`; nullptr on success, else its error's first line. No exception crosses the boundary.
template <typename F>
char* guard(F&& f) noexcept {
  try {
    f();
    return nullptr;
  } catch (const c10::Error& e) {
    return dup(first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return dup(first_line(e.what()));
  } catch (...) {
    return dup("unknown C++ exception");
  }
}

}  // namespace rc10d
