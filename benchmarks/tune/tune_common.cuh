// Shared by the dev tools in benchmarks/tune: exit on a CUDA error, and the median of
// event-timed repeats of a launch sequence.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                            \
  do {                                                      \
    cudaError_t e = (x);                                    \
    if (e != cudaSuccess) {                                 \
      printf("%s failed: %s\n", #x, cudaGetErrorString(e)); \
      exit(1);                                              \
    }                                                       \
  } while (0)

// Median in µs of `reps` timed calls of f (events recorded on `stream`), after `warmup`
// untimed ones; exits if any launch failed.
template <typename F>
float median_us(F&& f, int warmup = 5, int reps = 41, cudaStream_t stream = nullptr) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CHECK(cudaEventRecord(a, stream));
    f();
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3f);
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
