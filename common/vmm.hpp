#pragma once

// The CUDA driver's virtual memory calls that shared buffers use, reached
// through common/driver_entry.hpp: nothing links libcuda. Header-only.
//
// Why shared buffers use them: importing a pointer of an exportable pool
// (cudaMemPoolImportPointer) costs the driver about 0.8 us per MiB (3.4 ms
// for 4 GiB on an H100), one allocation of its own imports 4 GiB in 0.2-0.35
// ms (docs/benchmarks.md, section f; bench/experiments/).

#include "common/driver_entry.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <optional>
#include <string>

namespace rmmd::gpu {

struct vmm_api {
  CUresult (*mem_create)(CUmemGenericAllocationHandle*,
                         size_t,
                         CUmemAllocationProp const*,
                         unsigned long long){};
  CUresult (*mem_release)(CUmemGenericAllocationHandle){};
  CUresult (*export_handle)(void*,
                            CUmemGenericAllocationHandle,
                            CUmemAllocationHandleType,
                            unsigned long long){};
  CUresult (*import_handle)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType){};
  CUresult (*granularity)(size_t*, CUmemAllocationProp const*, CUmemAllocationGranularity_flags){};
  CUresult (*address_reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long){};
  CUresult (*address_free)(CUdeviceptr, size_t){};
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long){};
  CUresult (*unmap)(CUdeviceptr, size_t){};
  CUresult (*set_access)(CUdeviceptr, size_t, CUmemAccessDesc const*, size_t){};
  CUresult (*error_name)(CUresult, char const**){};

  /// The driver's name of `r` ("CUDA_ERROR_OUT_OF_MEMORY").
  [[nodiscard]] std::string name(CUresult r) const
  {
    char const* text = nullptr;
    if (error_name == nullptr || error_name(r, &text) != CUDA_SUCCESS || text == nullptr) {
      return "CUresult " + std::to_string(static_cast<int>(r));
    }
    return text;
  }
};

/// The entry points, looked up once; nullopt (and why, in `why`) when the
/// driver lacks one of them.
inline std::optional<vmm_api> const& vmm(std::string* why = nullptr)
{
  static std::string problem;
  static std::optional<vmm_api> const api = [] {
    vmm_api a;
    auto get = [&](char const* symbol, auto& fn) {
      return driver_entry_point(symbol, fn, 12000, &problem);
    };
    bool ok = get("cuMemCreate", a.mem_create) & get("cuMemRelease", a.mem_release) &
              get("cuMemExportToShareableHandle", a.export_handle) &
              get("cuMemImportFromShareableHandle", a.import_handle) &
              get("cuMemGetAllocationGranularity", a.granularity) &
              get("cuMemAddressReserve", a.address_reserve) &
              get("cuMemAddressFree", a.address_free) & get("cuMemMap", a.map) &
              get("cuMemUnmap", a.unmap) & get("cuMemSetAccess", a.set_access) &
              get("cuGetErrorName", a.error_name);
    return ok ? std::optional<vmm_api>(a) : std::nullopt;
  }();
  if (!api && why != nullptr) { *why = problem; }
  return api;
}

/// The allocation properties of device memory on `device` (the driver's
/// ordinal of this process) with `handle_types` requested.
inline CUmemAllocationProp device_allocation(int device, CUmemAllocationHandleType handle_types)
{
  CUmemAllocationProp prop{};
  prop.type                 = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type        = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id          = device;
  prop.requestedHandleTypes = handle_types;
  return prop;
}

}  // namespace rmmd::gpu
