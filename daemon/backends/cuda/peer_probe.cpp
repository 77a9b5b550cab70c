#include "daemon/backends/cuda/peer_probe.hpp"

#include "common/vmm.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <sys/random.h>

#include <cstring>
#include <stdexcept>

namespace rmmd::backends::cuda {
namespace {

std::string words_for(CUresult r, std::string const& name)
{
  switch (r) {
    case CUDA_ERROR_NOT_PERMITTED:
      return "no IMEX channel (/dev/nvidia-caps-imex-channels/channel0 missing) (" + name + ")";
    case CUDA_ERROR_NOT_SUPPORTED:
      return "not in the same NVLink domain or IMEX not running (" + name + ")";
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
      return "the handle is not one this node's IMEX domain knows: not in the same NVLink "
             "domain, or the exporter is gone (" +
             name + ")";
    case CUDA_ERROR_OUT_OF_MEMORY:
      return "out of memory mapping the probe (" + name + ")";
    default:
      return name;
  }
}

std::uint64_t random_pattern()
{
  std::uint64_t p = 0;
  while (p == 0) {
    if (::getrandom(&p, sizeof(p), 0) != static_cast<ssize_t>(sizeof(p))) {
      p = 0x5eed'f00d'cafe'0001;
    }
  }
  return p;
}

}  // namespace

fabric_probe_allocation::fabric_probe_allocation(int device) : device_(device)
{
  std::string why;
  auto const& api = gpu::vmm(&why);
  if (!api) { throw std::runtime_error(why); }
  if (auto err = cudaSetDevice(device); err != cudaSuccess) {
    throw std::runtime_error(std::string("cudaSetDevice: ") + cudaGetErrorName(err));
  }
  auto const prop   = gpu::device_allocation(device, CU_MEM_HANDLE_TYPE_FABRIC);
  std::size_t grain = 0;
  if (auto r = api->granularity(&grain, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
      r != CUDA_SUCCESS || grain == 0) {
    throw std::runtime_error("cuMemGetAllocationGranularity: " + api->name(r));
  }
  bytes_ = grain;
  CUmemGenericAllocationHandle handle{};
  if (auto r = api->mem_create(&handle, grain, &prop, 0); r != CUDA_SUCCESS) {
    throw std::runtime_error("cuMemCreate (fabric): " + api->name(r));
  }
  driver_handle_ = handle;
  auto fail      = [&](std::string what, CUresult r) {
    api->mem_release(handle);
    throw std::runtime_error(what + ": " + api->name(r));
  };
  // Fill it through a mapping of our own, then let go of the mapping.
  CUdeviceptr ptr{};
  if (auto r = api->address_reserve(&ptr, grain, grain, 0, 0); r != CUDA_SUCCESS) {
    fail("cuMemAddressReserve", r);
  }
  auto unreserve = [&] { api->address_free(ptr, grain); };
  if (auto r = api->map(ptr, grain, 0, handle, 0); r != CUDA_SUCCESS) {
    unreserve();
    fail("cuMemMap", r);
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id   = device;
  access.flags         = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  pattern_             = random_pattern();
  std::vector<std::uint64_t> words(grain / sizeof(std::uint64_t), pattern_);
  auto r             = api->set_access(ptr, grain, &access, 1);
  cudaError_t copied = cudaErrorUnknown;
  if (r == CUDA_SUCCESS) {
    copied = cudaMemcpy(reinterpret_cast<void*>(ptr), words.data(), grain, cudaMemcpyHostToDevice);
    // A copy from pageable memory may return before the device has it all:
    // the mapping goes only once it has.
    if (auto synced = cudaDeviceSynchronize(); copied == cudaSuccess) { copied = synced; }
  }
  api->unmap(ptr, grain);
  unreserve();
  if (r != CUDA_SUCCESS) { fail("cuMemSetAccess", r); }
  if (copied != cudaSuccess) {
    api->mem_release(handle);
    throw std::runtime_error(std::string("cudaMemcpy: ") + cudaGetErrorName(copied));
  }
  CUmemFabricHandle fabric{};
  if (auto e = api->export_handle(&fabric, handle, CU_MEM_HANDLE_TYPE_FABRIC, 0);
      e != CUDA_SUCCESS) {
    // Not released: destroying memory whose fabric export failed has killed
    // the process on this driver (DESIGN.md); one granule is leaked instead.
    driver_handle_ = 0;
    throw std::runtime_error("cuMemExportToShareableHandle (fabric): " + api->name(e) + " (its " +
                             std::to_string(grain) +
                             "-byte allocation is left allocated, not released: releasing memory "
                             "whose fabric export failed can kill the process on this driver)");
  }
  auto const* p = reinterpret_cast<std::byte const*>(&fabric);
  handle_.assign(p, p + sizeof(fabric));
}

fabric_probe_allocation::~fabric_probe_allocation()
{
  if (auto const& api = gpu::vmm(); api && driver_handle_ != 0) {
    cudaSetDevice(device_);
    api->mem_release(static_cast<CUmemGenericAllocationHandle>(driver_handle_));
  }
}

std::string import_fabric_probe(int device,
                                std::vector<std::byte> const& fabric_handle,
                                std::uint64_t bytes,
                                std::uint64_t pattern)
{
  std::string why;
  auto const& api = gpu::vmm(&why);
  if (!api) { return why; }
  if (fabric_handle.size() != sizeof(CUmemFabricHandle)) {
    return "the probe's fabric handle is " + std::to_string(fabric_handle.size()) + " bytes, not " +
           std::to_string(sizeof(CUmemFabricHandle));
  }
  if (bytes < sizeof(std::uint64_t) || bytes > (std::uint64_t{1} << 30)) {
    return "the probe's size " + std::to_string(bytes) + " is not one a probe has";
  }
  if (auto err = cudaSetDevice(device); err != cudaSuccess) {
    return std::string("cudaSetDevice: ") + cudaGetErrorName(err);
  }
  CUmemFabricHandle fabric{};
  std::memcpy(&fabric, fabric_handle.data(), sizeof(fabric));
  CUmemGenericAllocationHandle handle{};
  if (auto r = api->import_handle(&handle, &fabric, CU_MEM_HANDLE_TYPE_FABRIC); r != CUDA_SUCCESS) {
    return "cuMemImportFromShareableHandle: " + words_for(r, api->name(r));
  }
  std::string problem;
  CUdeviceptr ptr{};
  if (auto r = api->address_reserve(&ptr, bytes, 0, 0, 0); r != CUDA_SUCCESS) {
    api->mem_release(handle);
    return "cuMemAddressReserve: " + words_for(r, api->name(r));
  }
  if (auto r = api->map(ptr, bytes, 0, handle, 0); r != CUDA_SUCCESS) {
    problem = "cuMemMap: " + words_for(r, api->name(r));
  } else {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id   = device;
    access.flags         = CU_MEM_ACCESS_FLAGS_PROT_READ;
    if (auto a = api->set_access(ptr, bytes, &access, 1); a != CUDA_SUCCESS) {
      problem = "cuMemSetAccess: " + words_for(a, api->name(a));
    } else {
      std::uint64_t word = 0;
      auto err =
          cudaMemcpy(&word, reinterpret_cast<void*>(ptr), sizeof(word), cudaMemcpyDeviceToHost);
      // Nothing of the mapping's may be in flight when it goes.
      if (auto synced = cudaDeviceSynchronize(); err == cudaSuccess) { err = synced; }
      if (err != cudaSuccess) {
        problem = std::string("reading the probe: ") + cudaGetErrorName(err);
      } else if (word != pattern) {
        problem = "the probe reads back a different pattern: the handle maps other memory";
      }
    }
    api->unmap(ptr, bytes);
  }
  api->address_free(ptr, bytes);
  api->mem_release(handle);
  return problem;
}

}  // namespace rmmd::backends::cuda
