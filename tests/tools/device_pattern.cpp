#include "tests/tools/device_pattern.hpp"

#include "common/driver_entry.hpp"
#include "tests/tools/device_pattern_ptx.hpp"
#include "tests/tools/pattern.hpp"

#include <cuda.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace rmmd::test {
namespace {

// The driver's module calls, through common/driver_entry.hpp: nothing links
// libcuda.
struct kernels {
  CUresult (*module_load_data)(CUmodule*, void const*){};
  CUresult (*module_get_function)(CUfunction*, CUmodule, char const*){};
  CUresult (*launch_kernel)(CUfunction,
                            unsigned,
                            unsigned,
                            unsigned,
                            unsigned,
                            unsigned,
                            unsigned,
                            unsigned,
                            CUstream,
                            void**,
                            void**){};
  CUfunction fill{};
  CUfunction check{};
  std::string problem;  // empty: loaded
};

kernels const& loaded()
{
  static kernels const k = [] {
    kernels k;
    auto get = [&](char const* symbol, auto& fn) {
      gpu::driver_entry_point(symbol, fn, 12000, &k.problem);
    };
    get("cuModuleLoadData", k.module_load_data);
    get("cuModuleGetFunction", k.module_get_function);
    get("cuLaunchKernel", k.launch_kernel);
    if (!k.problem.empty()) { return k; }
    cudaFree(nullptr);  // the runtime's context current, for the module
    CUmodule module{};
    if (auto r = k.module_load_data(&module, device_pattern_ptx); r != CUDA_SUCCESS) {
      k.problem = "cuModuleLoadData of the PTX: CUresult " + std::to_string(static_cast<int>(r));
      return k;
    }
    if (k.module_get_function(&k.fill, module, "rmmd_pattern_fill") != CUDA_SUCCESS ||
        k.module_get_function(&k.check, module, "rmmd_pattern_check") != CUDA_SUCCESS) {
      k.problem = "the PTX lacks its kernels";
    }
    return k;
  }();
  return k;
}

void check_cuda(cudaError_t err, char const* what)
{
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(err));
  }
}

void launch(kernels const& k, CUfunction f, cudaStream_t stream, void** args, std::size_t words)
{
  constexpr unsigned threads = 256;
  auto const blocks =
      static_cast<unsigned>(std::clamp<std::size_t>((words + threads - 1) / threads, 1, 4096));
  if (auto r = k.launch_kernel(f, blocks, 1, 1, threads, 1, 1, 0, stream, args, nullptr);
      r != CUDA_SUCCESS) {
    throw std::runtime_error("cuLaunchKernel: CUresult " + std::to_string(static_cast<int>(r)));
  }
}

constexpr std::size_t host_chunk_words = std::size_t{8} << 20;  // 64 MiB

}  // namespace

void device_fill(void* p, std::size_t bytes, std::uint64_t seed, cudaStream_t stream)
{
  auto const words = bytes / 8;
  auto const& k    = loaded();
  if (k.problem.empty()) {
    unsigned long long count = words, s = seed;
    void* args[] = {&p, &count, &s};
    launch(k, k.fill, stream, args, words);
    return;
  }
  std::vector<std::uint64_t> host(std::min(words, host_chunk_words));
  for (std::size_t at = 0; at < words; at += host.size()) {
    auto const n = std::min(host.size(), words - at);
    for (std::size_t i = 0; i < n; ++i) { host[i] = pattern(seed, at + i); }
    check_cuda(cudaMemcpyAsync(static_cast<std::uint64_t*>(p) + at,
                               host.data(),
                               n * 8,
                               cudaMemcpyHostToDevice,
                               stream),
               "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
}

long device_first_mismatch(void const* p,
                           std::size_t bytes,
                           std::uint64_t seed,
                           cudaStream_t stream)
{
  auto const words = bytes / 8;
  auto const& k    = loaded();
  if (k.problem.empty()) {
    void* first = nullptr;
    check_cuda(cudaMallocAsync(&first, sizeof(std::uint64_t), stream), "cudaMallocAsync");
    check_cuda(cudaMemsetAsync(first, 0xff, sizeof(std::uint64_t), stream), "cudaMemsetAsync");
    unsigned long long count = words, s = seed;
    void* args[] = {&p, &count, &s, &first};
    launch(k, k.check, stream, args, words);
    std::uint64_t result = 0;
    check_cuda(cudaMemcpyAsync(&result, first, sizeof result, cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync");
    check_cuda(cudaFreeAsync(first, stream), "cudaFreeAsync");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return result == ~std::uint64_t{0} ? -1 : static_cast<long>(result);
  }
  std::vector<std::uint64_t> host(std::min(words, host_chunk_words));
  for (std::size_t at = 0; at < words; at += host.size()) {
    auto const n = std::min(host.size(), words - at);
    check_cuda(cudaMemcpyAsync(host.data(),
                               static_cast<std::uint64_t const*>(p) + at,
                               n * 8,
                               cudaMemcpyDeviceToHost,
                               stream),
               "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    for (std::size_t i = 0; i < n; ++i) {
      if (host[i] != pattern(seed, at + i)) { return static_cast<long>(at + i); }
    }
  }
  return -1;
}

std::string device_pattern_method()
{
  auto const& k = loaded();
  return k.problem.empty() ? "kernel" : "host copies (" + k.problem + ")";
}

}  // namespace rmmd::test
