// Kernels that write and check tests/tools/pattern.hpp's pattern on the GPU,
// so that a test checks gigabytes without copying them back. Built as PTX
// (tests/CMakeLists.txt) and loaded by device_pattern.cpp; the driver
// compiles it for the GPU at first use.

extern "C" __device__ unsigned long long rmmd_pattern_word(unsigned long long seed,
                                                           unsigned long long word)
{
  return (seed + 1) * 0x9E3779B97F4A7C15ULL ^ (word * 0xBF58476D1CE4E5B9ULL);
}

extern "C" __global__ void rmmd_pattern_fill(unsigned long long* words,
                                             unsigned long long count,
                                             unsigned long long seed)
{
  unsigned long long const step = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i =
           static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count;
       i += step) {
    words[i] = rmmd_pattern_word(seed, i);
  }
}

extern "C" __global__ void rmmd_pattern_check(unsigned long long const* words,
                                              unsigned long long count,
                                              unsigned long long seed,
                                              unsigned long long* first_mismatch)
{
  unsigned long long const step = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i =
           static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count;
       i += step) {
    if (words[i] != rmmd_pattern_word(seed, i)) { atomicMin(first_mismatch, i); }
  }
}
