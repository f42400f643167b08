// Error checks for the standalone tools (no Python, no XLA): print the failing call's location and exit.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

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

namespace jax_ops::tools {

// One launch: launch(i) where it takes the launch's index in its round, else launch(); a returned status is checked.
template <typename F>
void LaunchOnce(F& launch, int i) {
  if constexpr (std::is_invocable_v<F&, int>) {
    if constexpr (std::is_void_v<std::invoke_result_t<F&, int>>)
      launch(i);
    else
      CHECK(launch(i));
  } else {
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>)
      launch();
    else
      CHECK(launch());
  }
}

// Milliseconds per launch in each of `rounds` rounds of `reps` back-to-back launches (event-timed on the default
// stream), after `warmup` untimed launches.
template <typename F>
std::vector<float> RoundTimesMs(F&& launch, int warmup, int rounds, int reps) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) LaunchOnce(launch, i);
  std::vector<float> per_launch;
  for (int r = 0; r < rounds; ++r) {
    CHECK(cudaEventRecord(start));
    for (int i = 0; i < reps; ++i) LaunchOnce(launch, i);
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    per_launch.push_back(ms / reps);
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return per_launch;
}

inline float Median(std::vector<float> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace jax_ops::tools
