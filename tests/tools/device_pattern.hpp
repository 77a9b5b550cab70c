#pragma once

// tests/tools/pattern.hpp's pattern written and checked on the GPU by the
// kernels of device_pattern.cu: word i of a buffer holds pattern(seed, i).
// 4 GiB is checked in milliseconds instead of the seconds a copy back to the
// host and a check there take. Where the driver cannot load the kernels
// (it says why in method()), both fall back to doing it on the host through
// copies, slower but the same answer.
//
// The kernels are loaded once per process into the context current at the
// first call: a process uses them on one device. Thread safety: the calls
// may come from any thread.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace rmmd::test {

/// Writes the pattern of `seed` into [p, p + bytes) (whole 64-bit words),
/// queued on `stream`. Throws std::runtime_error naming the CUDA error.
void device_fill(void* p, std::size_t bytes, std::uint64_t seed, cudaStream_t stream);

/// The index of the first word of [p, p + bytes) that does not hold the
/// pattern of `seed`, or -1. Runs after the work queued on `stream` and
/// synchronises it. Throws std::runtime_error naming the CUDA error.
long device_first_mismatch(void const* p,
                           std::size_t bytes,
                           std::uint64_t seed,
                           cudaStream_t stream);

/// "kernel", or "host copies (WHY the kernels did not load)".
std::string device_pattern_method();

}  // namespace rmmd::test
