#include "daemon/backends/cuda/buffer_import.hpp"

#include "common/driver_entry.hpp"
#include "common/vmm.hpp"

#include <absl/strings/str_format.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace rmmd::backends::cuda {
namespace {

using properties_fn = CUresult (*)(CUmemAllocationProp*, CUmemGenericAllocationHandle);

/// cuMemGetAllocationPropertiesFromHandle, which common/vmm.hpp does not
/// look up (no client needs it); null where the driver lacks it.
properties_fn allocation_properties()
{
  static properties_fn const fn = [] {
    properties_fn f = nullptr;
    gpu::driver_entry_point("cuMemGetAllocationPropertiesFromHandle", f);
    return f;
  }();
  return fn;
}

}  // namespace

absl::StatusOr<imported_buffer> import_buffer(
    int device, int fd, std::size_t allocation_bytes, bool fabric, std::string_view recorded_fabric)
{
  std::string why;
  auto const& api = gpu::vmm(&why);
  if (!api) { return absl::FailedPreconditionError("no CUDA virtual memory API: " + why); }
  if (auto err = cudaSetDevice(device); err != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cudaSetDevice(%d): %s", device, cudaGetErrorName(err)));
  }
  CUmemGenericAllocationHandle handle{};
  if (auto r = api->import_handle(&handle,
                                  reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      r != CUDA_SUCCESS) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the driver does not take its fd as a CUDA allocation (cuMemImportFromShareableHandle: "
        "%s)",
        api->name(r)));
  }
  auto fail = [&](std::string what) {
    api->mem_release(handle);
    return absl::InvalidArgumentError(std::move(what));
  };
  CUmemAllocationProp prop{};
  if (auto props = allocation_properties()) {
    if (auto r = props(&prop, handle); r != CUDA_SUCCESS) {
      return fail("cuMemGetAllocationPropertiesFromHandle: " + api->name(r));
    }
    if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != device) {
      return fail(absl::StrFormat("its allocation lives on device %d, not on its pool's device %d",
                                  prop.location.id,
                                  device));
    }
  } else {
    prop = gpu::device_allocation(device, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  }
  std::size_t grain = 0;
  if (auto r = api->granularity(&grain, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      r != CUDA_SUCCESS || grain == 0 || allocation_bytes % grain != 0) {
    return fail(absl::StrFormat(
        "its recorded allocation of %d bytes is not a multiple of the device's granularity",
        allocation_bytes));
  }
  // The size: a mapping of allocation_bytes succeeds only if the allocation
  // has that many bytes (the driver knows its size; no call returns it).
  CUdeviceptr va{};
  if (auto r = api->address_reserve(&va, allocation_bytes, 0, 0, 0); r != CUDA_SUCCESS) {
    return fail("cuMemAddressReserve of " + std::to_string(allocation_bytes) +
                " bytes: " + api->name(r));
  }
  auto const mapped = api->map(va, allocation_bytes, 0, handle, 0);
  if (mapped == CUDA_SUCCESS) { api->unmap(va, allocation_bytes); }
  api->address_free(va, allocation_bytes);
  if (mapped != CUDA_SUCCESS) {
    return fail(
        absl::StrFormat("its allocation is smaller than the %d bytes recorded (cuMemMap: %s)",
                        allocation_bytes,
                        api->name(mapped)));
  }

  imported_buffer out;
  out.memory = core::shared_allocation{
      .block = {.bytes = allocation_bytes}, .fd = fd, .driver_handle = handle};
  if (fabric) {
    CUmemFabricHandle fh{};
    std::string exported;  // why no handle came from the imported allocation
    if ((prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) == 0) {
      exported = "its allocation, as the driver imports it, offers no fabric handle";
    } else if (auto r = api->export_handle(&fh, handle, CU_MEM_HANDLE_TYPE_FABRIC, 0);
               r != CUDA_SUCCESS) {
      exported = "the driver does not export the imported allocation as a fabric handle (" +
                 api->name(r) + ")";
    } else {
      auto const* p = reinterpret_cast<std::byte const*>(&fh);
      out.memory.fabric_handle.assign(p, p + sizeof(fh));
    }
    if (!exported.empty() && recorded_fabric.size() != sizeof(CUmemFabricHandle)) {
      out.fabric_note = exported + ", and the state file holds no fabric handle for it";
    } else if (!exported.empty()) {
      std::memcpy(&fh, recorded_fabric.data(), sizeof(fh));
      CUmemGenericAllocationHandle probe{};
      if (auto r = api->import_handle(&probe, &fh, CU_MEM_HANDLE_TYPE_FABRIC); r != CUDA_SUCCESS) {
        out.fabric_note =
            exported + ", and does not import the recorded one (" + api->name(r) + ")";
      } else {
        api->mem_release(probe);
        auto const* p = reinterpret_cast<std::byte const*>(recorded_fabric.data());
        out.memory.fabric_handle.assign(p, p + recorded_fabric.size());
        out.recorded_fabric = true;
      }
    }
  }
  return out;
}

void release_own(int device, core::shared_allocation const& memory) noexcept
{
  if (memory.fd >= 0) { ::close(memory.fd); }
  if (auto const& api = gpu::vmm(); api && memory.driver_handle != 0) {
    cudaSetDevice(device);
    api->mem_release(static_cast<CUmemGenericAllocationHandle>(memory.driver_handle));
  }
}

}  // namespace rmmd::backends::cuda
