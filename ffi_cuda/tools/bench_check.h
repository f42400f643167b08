// Error checks for the standalone tools (no Python, no XLA): print the failing call's location and exit.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace jax_ops::tools {

// Prints "<lib> error <what> at <file>:<line>" and exits: the failure path of CHECK_STATUS.
[[noreturn]] inline void CheckFailed(const char* lib, const std::string& what, const char* file, int line) {
  std::printf("%s error %s at %s:%d\n", lib, what.c_str(), file, line);
  std::exit(1);
}

}  // namespace jax_ops::tools

// CHECK_STATUS(x, ok, lib, text): x (a library call's status) must equal ok; else text(status) names the error.
#define CHECK_STATUS(x, ok, lib, text)                                                        \
  do {                                                                                        \
    const auto status_ = (x);                                                                 \
    if (status_ != (ok)) jax_ops::tools::CheckFailed(lib, text(status_), __FILE__, __LINE__); \
  } while (0)

#define CHECK(x) CHECK_STATUS(x, cudaSuccess, "CUDA", cudaGetErrorString)
