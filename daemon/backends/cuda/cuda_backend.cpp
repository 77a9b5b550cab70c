#include "daemon/backends/cuda/cuda_backend.hpp"

#include "common/vmm.hpp"
#include "daemon/backends/cuda/buffer_import.hpp"

#include <absl/strings/str_format.h>
#include <rmm/error.hpp>

#include <unistd.h>

#include <stdexcept>

namespace rmmd::backends::cuda {
namespace {

using handle_type = rmm::mr::cuda_async_memory_resource::allocation_handle_type;

/// Allocations are rounded to this (cudaMallocFromPoolAsync's own alignment).
constexpr std::size_t granularity = 256;

void check(cudaError_t err, char const* what)
{
  if (err != cudaSuccess) {
    throw std::runtime_error(absl::StrFormat(
        "%s failed: %s (%s)", what, cudaGetErrorName(err), cudaGetErrorString(err)));
  }
}

/// Makes `device` current for the calling thread (gRPC threads come and go).
void use_device(int device)
{
  check(cudaSetDevice(device), "cudaSetDevice");
}

std::unique_ptr<rmm::mr::cuda_async_memory_resource> make_pool(cuda_pool_options const& o)
{
  use_device(o.device);
  auto type =
      o.fabric
          ? static_cast<handle_type>(cudaMemHandleTypePosixFileDescriptor | cudaMemHandleTypeFabric)
          : handle_type::posix_file_descriptor;
  auto initial = o.initial_size == 0 ? std::nullopt : std::optional<std::size_t>(o.initial_size);
  return std::make_unique<rmm::mr::cuda_async_memory_resource>(initial, o.release_threshold, type);
}

}  // namespace

int device_count() noexcept
{
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::optional<std::size_t> driver_used_bytes(int device) noexcept
{
  std::size_t free  = 0;
  std::size_t total = 0;
  if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  return total - free;
}

cuda_streams::cuda_streams(int device) : device_(device)
{
  use_device(device);
  try {
    check(cudaStreamCreateWithFlags(&free_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    for (auto& stream : allocation_) {
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    }
  } catch (...) {
    destroy();  // the destructor does not run if this throws
    throw;
  }
}

cuda_streams::~cuda_streams()
{
  destroy();
}

void cuda_streams::destroy() noexcept
{
  cudaSetDevice(device_);
  if (free_ != nullptr) { cudaStreamDestroy(free_); }
  free_ = nullptr;
  for (auto& stream : allocation_) {
    if (stream != nullptr) { cudaStreamDestroy(stream); }
    stream = nullptr;
  }
}

cuda_backend::cuda_backend(cuda_pool_options options)
    : options_(options),
      mr_(make_pool(options_)),
      streams_(options_.streams ? options_.streams
                                : std::make_shared<cuda_streams>(options_.device))
{
  use_device(options_.device);
  // Exporting the pool once is also what makes its pointers exportable.
  check(cudaMemPoolExportToShareableHandle(
            &fd_, mr_->pool_handle(), cudaMemHandleTypePosixFileDescriptor, 0),
        "cudaMemPoolExportToShareableHandle (posix fd)");
  if (options_.fabric) {
    cudaMemFabricHandle_t handle{};
    auto err =
        cudaMemPoolExportToShareableHandle(&handle, mr_->pool_handle(), cudaMemHandleTypeFabric, 0);
    if (err != cudaSuccess) {
      // Destroying a pool whose fabric export failed kills the process
      // (DESIGN.md): leak this one on purpose and let the caller fall back.
      (void)mr_.release();
      ::close(fd_);
      fd_ = -1;
      throw std::runtime_error(absl::StrFormat(
          "cudaMemPoolExportToShareableHandle (fabric) failed: %s", cudaGetErrorName(err)));
    }
    auto const* raw = reinterpret_cast<std::byte const*>(&handle);
    fabric_.assign(raw, raw + sizeof(handle));
  }
}

cuda_backend::~cuda_backend()
{
  if (fd_ >= 0) { ::close(fd_); }
}

absl::StatusOr<core::backend_allocation> cuda_backend::allocate(std::size_t bytes,
                                                                std::size_t alignment)
{
  if (alignment > granularity) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "alignment %d is larger than the %d bytes CUDA pools guarantee", alignment, granularity));
  }
  auto const size = (bytes + granularity - 1) / granularity * granularity;
  if (auto err = cudaSetDevice(options_.device); err != cudaSuccess) {
    return absl::InternalError(absl::StrFormat("cudaSetDevice: %s", cudaGetErrorName(err)));
  }
  auto const stream = streams_->next_allocation_stream();
  void* ptr         = nullptr;
  // A device full of spares gives them back and tries once more (also where
  // their expiry gave some back meanwhile).
  auto const released = options_.spares ? options_.spares->released() : 0;
  for (bool retried = false; ptr == nullptr; retried = true) {
    try {
      ptr = mr_->allocate(::cuda::stream_ref{stream}, size, granularity);
    } catch (rmm::out_of_memory const& e) {
      if (!retried && spares_came_back(released)) { continue; }
      return absl::ResourceExhaustedError(
          absl::StrFormat("device %d is out of memory: %s", options_.device, e.what()));
    } catch (std::exception const& e) {
      return absl::InternalError(e.what());
    }
  }
  // The client uses the memory on streams of its own, in another process:
  // the allocation must be complete before anyone hears of it.
  cudaMemPoolPtrExportData data{};
  auto err = cudaStreamSynchronize(stream);
  if (err == cudaSuccess) { err = cudaMemPoolExportPointer(&data, ptr); }
  if (err != cudaSuccess) {
    mr_->deallocate(::cuda::stream_ref{stream}, ptr, size, granularity);
    return absl::InternalError(absl::StrFormat("exporting a pointer of the pool on device %d: %s",
                                               options_.device,
                                               cudaGetErrorName(err)));
  }
  core::backend_allocation block{.bytes = size, .address = ptr};
  auto const* raw = reinterpret_cast<std::byte const*>(&data);
  block.export_data.assign(raw, raw + sizeof(data));
  return block;
}

bool cuda_backend::spares_came_back(std::uint64_t released_before) noexcept
{
  if (!options_.spares) { return false; }
  options_.spares->give_back();
  return options_.spares->released() != released_before;
}

void cuda_backend::deallocate(core::backend_allocation const& block) noexcept
{
  // Every importer has freed its import before this point: the client sends
  // Free once its stream has passed its own free of the import (a host
  // function enqueued after it); a dead client's imports died with it.
  cudaSetDevice(options_.device);
  mr_->deallocate(
      ::cuda::stream_ref{streams_->free_stream()}, block.address, block.bytes, granularity);
}

void cuda_backend::deallocate_many(std::span<core::backend_allocation const> blocks) noexcept
{
  // A closing session's leases, all on the pool's stream: each is one
  // cudaFreeAsync, which the driver serialises; nothing to batch but the rest.
  cudaSetDevice(options_.device);
  for (auto const& block : blocks) {
    mr_->deallocate(
        ::cuda::stream_ref{streams_->free_stream()}, block.address, block.bytes, granularity);
  }
}

absl::StatusOr<core::shared_allocation> cuda_backend::allocate_shared(std::size_t bytes,
                                                                      std::size_t alignment)
{
  if (!options_.vmm_buffers && bytes <= largest_pool_pointer) {
    return pool_backend::allocate_shared(bytes, alignment);
  }
  // A driver without the virtual memory API (none we support) still shares
  // buffers: as pointers of the pool.
  if (!gpu::vmm()) { return pool_backend::allocate_shared(bytes, alignment); }
  return allocate_own(bytes, alignment, !fabric_.empty());
}

absl::StatusOr<core::stable_memory> cuda_backend::allocate_stable(std::size_t bytes,
                                                                  core::stable_request const& who)
{
  // Whatever --cuda-shared-buffer-memory says: the client maps it at its own
  // addresses, which only an allocation of its own allows. No fabric handle:
  // it is mapped on this node, by its session's process.
  std::string why;
  if (!gpu::vmm(&why)) {
    return absl::FailedPreconditionError(
        "address-stable memory needs the driver's virtual "
        "memory API: " +
        why);
  }
  auto const grain = own_granularity(false);
  if (!grain.ok()) { return grain.status(); }
  auto const size = (bytes + *grain - 1) / *grain * *grain;
  core::stable_memory out;
  if (options_.spares) {
    out.pieces = options_.spares->take(size, who.owner, std::max<std::size_t>(who.max_pieces, 1));
  }
  if (auto const have = out.bytes(); have < size) {
    auto fresh = allocate_own(size - have, 0, false);
    if (!fresh.ok()) {
      deallocate_stable(out, who.owner, core::stable_return::reusable);  // never mapped
      return fresh.status();
    }
    out.pieces.push_back(*std::move(fresh));
  }
  return out;
}

void cuda_backend::deallocate_stable(core::stable_memory const& memory,
                                     uid_t owner,
                                     core::stable_return how) noexcept
{
  bool const keep = options_.spares && how == core::stable_return::reusable;
  for (auto const& piece : memory.pieces) {
    if (keep && piece.driver_handle != 0 && piece.fd >= 0) {
      try {
        options_.spares->keep(piece, owner);
        continue;
      } catch (std::exception const&) {  // no room to note it: the driver takes it
      }
    }
    deallocate_shared(piece);
  }
}

absl::StatusOr<std::size_t> cuda_backend::own_granularity(bool fabric) const
{
  auto const& api  = gpu::vmm();
  auto const types = static_cast<CUmemAllocationHandleType>(
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | (fabric ? CU_MEM_HANDLE_TYPE_FABRIC : 0));
  auto const prop   = gpu::device_allocation(options_.device, types);
  std::size_t grain = 0;
  if (auto r = api->granularity(&grain, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
      r != CUDA_SUCCESS || grain == 0) {
    return absl::InternalError("cuMemGetAllocationGranularity: " + api->name(r));
  }
  return grain;
}

absl::StatusOr<core::shared_allocation> cuda_backend::allocate_own(std::size_t bytes,
                                                                   std::size_t alignment,
                                                                   bool fabric)
{
  auto const& api = gpu::vmm();
  if (auto err = cudaSetDevice(options_.device); err != cudaSuccess) {
    return absl::InternalError(absl::StrFormat("cudaSetDevice: %s", cudaGetErrorName(err)));
  }
  auto const types = static_cast<CUmemAllocationHandleType>(
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | (fabric ? CU_MEM_HANDLE_TYPE_FABRIC : 0));
  auto const prop  = gpu::device_allocation(options_.device, types);
  auto const grain = own_granularity(fabric);
  if (!grain.ok()) { return grain.status(); }
  if (alignment > *grain) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "alignment %d is larger than the %d bytes a shared buffer's allocation is aligned to",
        alignment,
        *grain));
  }
  auto const size = (bytes + *grain - 1) / *grain * *grain;
  CUmemGenericAllocationHandle handle{};
  auto const released = options_.spares ? options_.spares->released() : 0;
  auto made           = api->mem_create(&handle, size, &prop, 0);
  // A device full of spares gives them back and tries once more.
  if (made == CUDA_ERROR_OUT_OF_MEMORY && spares_came_back(released)) {
    made = api->mem_create(&handle, size, &prop, 0);
  }
  if (made != CUDA_SUCCESS) {
    auto message = absl::StrFormat("cuMemCreate of %d bytes: %s", size, api->name(made));
    return made == CUDA_ERROR_OUT_OF_MEMORY ? absl::ResourceExhaustedError(message)
                                            : absl::InternalError(message);
  }
  core::shared_allocation block{.block = {.bytes = size}, .driver_handle = handle};
  auto fail = [&](std::string what, CUresult r) {
    if (block.fd >= 0) { ::close(block.fd); }
    api->mem_release(handle);
    return absl::InternalError(what + ": " + api->name(r));
  };
  if (auto r = api->export_handle(&block.fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      r != CUDA_SUCCESS) {
    block.fd = -1;
    return fail("cuMemExportToShareableHandle (posix fd)", r);
  }
  if (fabric) {
    CUmemFabricHandle handle_out{};
    if (auto r = api->export_handle(&handle_out, handle, CU_MEM_HANDLE_TYPE_FABRIC, 0);
        r != CUDA_SUCCESS) {
      return fail("cuMemExportToShareableHandle (fabric)", r);
    }
    auto const* p = reinterpret_cast<std::byte const*>(&handle_out);
    block.fabric_handle.assign(p, p + sizeof(handle_out));
  }
  return block;
}

void cuda_backend::deallocate_shared(core::shared_allocation const& block) noexcept
{
  if (block.driver_handle == 0) {  // a pointer of the pool
    deallocate(block.block);
    return;
  }
  // Importers hold the allocation until they release their import (the
  // driver counts them): the daemon's release only drops its own share.
  release_own(options_.device, block);
}

absl::StatusOr<std::size_t> cuda_backend::trim()
{
  if (auto err = cudaSetDevice(options_.device); err != cudaSuccess) {
    return absl::InternalError(absl::StrFormat("cudaSetDevice: %s", cudaGetErrorName(err)));
  }
  auto const before = usage();
  auto err          = cudaStreamSynchronize(streams_->free_stream());
  if (err == cudaSuccess) { err = cudaMemPoolTrimTo(mr_->pool_handle(), 0); }
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrFormat(
        "trimming the pool of device %d: %s", options_.device, cudaGetErrorName(err)));
  }
  auto const after  = usage();
  auto const spares = options_.spares ? options_.spares->give_back() : 0;
  if (!before || !after || after->reserved_bytes >= before->reserved_bytes) { return spares; }
  return spares + static_cast<std::size_t>(before->reserved_bytes - after->reserved_bytes);
}

std::optional<std::size_t> cuda_backend::release_threshold() const
{
  std::uint64_t v{};
  if (cudaMemPoolGetAttribute(mr_->pool_handle(), cudaMemPoolAttrReleaseThreshold, &v) !=
      cudaSuccess) {
    return std::nullopt;
  }
  return static_cast<std::size_t>(v);
}

std::optional<core::backend_usage> cuda_backend::usage() const
{
  core::backend_usage u;
  auto pool = mr_->pool_handle();
  std::uint64_t v{};
  if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v) != cudaSuccess) {
    return std::nullopt;
  }
  u.reserved_bytes = v;
  if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &v) != cudaSuccess) {
    return std::nullopt;
  }
  u.used_bytes = v;
  return u;
}

}  // namespace rmmd::backends::cuda
