#include "client/detail/existing_context.hpp"

#include "common/driver_entry.hpp"

#include <cuda_runtime_api.h>

namespace rmmd::detail {
namespace {

/// The driver calls it takes (common/driver_entry.hpp); a null member where
/// the driver lacks one.
struct context_api {
  CUresult (*get_current)(CUcontext*){};
  CUresult (*device_get)(CUdevice*, int){};
  CUresult (*primary_state)(CUdevice, unsigned int*, int*){};
  CUresult (*primary_retain)(CUcontext*, CUdevice){};
  CUresult (*primary_release)(CUdevice){};
  CUresult (*push)(CUcontext){};
  CUresult (*pop)(CUcontext*){};

  [[nodiscard]] bool complete() const noexcept
  {
    return get_current != nullptr && device_get != nullptr && primary_state != nullptr &&
           primary_retain != nullptr && primary_release != nullptr && push != nullptr &&
           pop != nullptr;
  }
};

context_api const& driver() noexcept
{
  static context_api const api = [] {
    context_api a;
    auto get = [](char const* symbol, auto& fn) { gpu::driver_entry_point(symbol, fn); };
    get("cuCtxGetCurrent", a.get_current);
    get("cuDeviceGet", a.device_get);
    get("cuDevicePrimaryCtxGetState", a.primary_state);
    get("cuDevicePrimaryCtxRetain", a.primary_retain);
    get("cuDevicePrimaryCtxRelease", a.primary_release);
    get("cuCtxPushCurrent", a.push);
    get("cuCtxPopCurrent", a.pop);
    return a;
  }();
  return api;
}

}  // namespace

existing_context::existing_context() noexcept
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  auto const& api = driver();
  if (!api.complete()) { return; }
  CUcontext current{};
  if (api.get_current(&current) == CUDA_SUCCESS && current != nullptr) {
    found_ = true;
    return;
  }
  for (int ordinal = 0; ordinal < devices; ++ordinal) {
    CUdevice device{};
    unsigned int flags = 0;
    int active         = 0;
    if (api.device_get(&device, ordinal) != CUDA_SUCCESS ||
        api.primary_state(device, &flags, &active) != CUDA_SUCCESS || active == 0) {
      continue;
    }
    // Retaining an active primary context takes a reference; it makes none
    // (unless another thread releases the last reference, cudaDeviceReset,
    // between the two calls: then the retain makes it again, as the
    // process's next CUDA call on that device would).
    CUcontext primary{};
    if (api.primary_retain(&primary, device) != CUDA_SUCCESS) { continue; }
    if (api.push(primary) != CUDA_SUCCESS) {
      api.primary_release(device);
      continue;
    }
    found_  = true;
    pushed_ = true;
    device_ = device;
    return;
  }
}

existing_context::~existing_context()
{
  if (!pushed_) { return; }
  auto const& api = driver();
  CUcontext popped{};
  api.pop(&popped);
  api.primary_release(device_);
}

}  // namespace rmmd::detail
