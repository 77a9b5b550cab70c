#pragma once

// The GPU tests' one question to CUDA before they start: how many GPUs it
// sees (0 without a GPU or a driver), and a skip that says so.

#include <cuda_runtime_api.h>

namespace rmmd::test {

inline int gpu_count()
{
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace rmmd::test

#define REQUIRE_GPUS(n)                                                                           \
  do {                                                                                            \
    if (::rmmd::test::gpu_count() < (n)) {                                                        \
      GTEST_SKIP() << "needs " << (n) << " CUDA GPU(s); CUDA sees " << ::rmmd::test::gpu_count(); \
    }                                                                                             \
  } while (0)
