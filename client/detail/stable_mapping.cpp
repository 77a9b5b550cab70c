#include "client/detail/stable_mapping.hpp"

#include "client/detail/call_status.hpp"
#include "common/fd_passing.hpp"
#include "common/vmm.hpp"

#include <rmm/error.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

namespace rmmd::detail::stable {
namespace {

/// Most fds one StableFds call brings (daemon/core/stable_registry.hpp).
constexpr std::size_t fds_per_call = 250;

gpu::vmm_api const& api()
{
  std::string why;
  auto const& found = gpu::vmm(&why);
  if (!found) { throw rmm::bad_alloc("rmmd: address-stable memory: " + why); }
  return *found;
}

[[noreturn]] void driver_failed(gpu::vmm_api const& a, char const* what, CUresult r)
{
  throw rmm::bad_alloc(std::string("rmmd: ") + what + ": " + a.name(r));
}

}  // namespace

void check(cudaError_t err, char const* what)
{
  if (err == cudaSuccess) { return; }
  cudaGetLastError();
  throw rmm::bad_alloc(std::string("rmmd: ") + what + ": " + cudaGetErrorName(err));
}

std::uintptr_t reserve(std::size_t bytes)
{
  auto const& a  = api();
  CUdeviceptr va = 0;
  if (auto r = a.address_reserve(&va, bytes, 0, 0, 0); r != CUDA_SUCCESS) {
    driver_failed(a, "cuMemAddressReserve", r);
  }
  return static_cast<std::uintptr_t>(va);
}

void unreserve(std::uintptr_t address, std::size_t bytes) noexcept
{
  if (auto const& a = gpu::vmm()) { a->address_free(static_cast<CUdeviceptr>(address), bytes); }
}

void map(stable_memory_resource_impl::entry& e,
         std::vector<int> fds,
         std::span<std::uint64_t const> piece_bytes,
         int device)
{
  auto close_all = [&] {
    fd_passing::close_fds(fds, fds.size());
    fds.clear();
  };
  std::vector<std::size_t> pieces(piece_bytes.begin(), piece_bytes.end());
  if (pieces.empty()) { pieces.push_back(e.bytes); }
  std::size_t total = 0;
  for (auto bytes : pieces) { total += bytes; }
  if (fds.size() != pieces.size() || total != e.bytes) {
    close_all();
    throw rmm::bad_alloc("rmmd: the daemon's reply brought memory of " + std::to_string(total) +
                         " bytes in " + std::to_string(pieces.size()) + " pieces and " +
                         std::to_string(fds.size()) + " fds for an allocation of " +
                         std::to_string(e.bytes) + " bytes");
  }
  auto const& a = [&]() -> gpu::vmm_api const& {
    try {
      return api();
    } catch (...) {
      close_all();
      throw;
    }
  }();
  std::vector<CUmemGenericAllocationHandle> handles;
  std::size_t mapped = 0;  // bytes mapped from e.address
  auto undo          = [&] {
    if (mapped > 0) { a.unmap(static_cast<CUdeviceptr>(e.address), mapped); }
    for (auto h : handles) { a.mem_release(h); }
  };
  for (std::size_t i = 0; i < fds.size(); ++i) {
    CUmemGenericAllocationHandle handle{};
    auto r = a.import_handle(&handle,
                             reinterpret_cast<void*>(static_cast<std::uintptr_t>(fds[i])),
                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    ::close(fds[i]);  // the import holds the allocation now
    fds[i] = -1;
    if (r == CUDA_SUCCESS) {
      handles.push_back(handle);
      r = a.map(static_cast<CUdeviceptr>(e.address + mapped), pieces[i], 0, handle, 0);
      if (r == CUDA_SUCCESS) { mapped += pieces[i]; }
    }
    if (r != CUDA_SUCCESS) {
      close_all();
      undo();
      driver_failed(
          a, handles.size() == i ? "cuMemImportFromShareableHandle (posix fd)" : "cuMemMap", r);
    }
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id   = device;
  access.flags         = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (auto r = a.set_access(static_cast<CUdeviceptr>(e.address), e.bytes, &access, 1);
      r != CUDA_SUCCESS) {
    undo();
    driver_failed(a, "cuMemSetAccess", r);
  }
  e.handles.assign(handles.begin(), handles.end());
  e.pieces = std::move(pieces);
  e.mapped = true;
  e.kept   = false;
}

void unmap(stable_memory_resource_impl::entry& e) noexcept
{
  if (!e.mapped) { return; }
  if (auto const& a = gpu::vmm()) {
    a->unmap(static_cast<CUdeviceptr>(e.address), e.bytes);
    for (auto h : e.handles) { a->mem_release(static_cast<CUmemGenericAllocationHandle>(h)); }
  }
  e.mapped = false;
  e.handles.clear();
  e.pieces.clear();
}

std::vector<std::vector<int>> fetch_fds(session_impl& session,
                                        std::span<std::uint64_t const> ids,
                                        std::span<std::size_t const> counts,
                                        bool backup)
{
  std::vector<std::vector<int>> all;
  auto close_all = [&] {
    for (auto& fds : all) { fd_passing::close_fds(fds, fds.size()); }
  };
  try {
    for (std::size_t at = 0; at < ids.size();) {
      // As many ids as fit one call's fds (one at least: the daemon sends
      // at most 64 pieces an allocation).
      std::size_t end = at, want = 0;
      while (end < ids.size() && (end == at || want + counts[end] <= fds_per_call)) {
        want += counts[end++];
      }
      v1::SessionCall call;
      auto* request = call.mutable_stable_fds();
      for (auto i = at; i < end; ++i) { request->add_allocation_ids(ids[i]); }
      request->set_backup(backup);
      v1::SessionReply reply;
      std::vector<int> fds;
      auto status = session.channel().call(call, &reply, &fds);
      if (status.ok() &&
          (fds.size() != want || reply.stable_fds().fd_count() != static_cast<int>(want))) {
        status = grpc::Status(grpc::StatusCode::INTERNAL,
                              "the daemon's reply brought " + std::to_string(fds.size()) +
                                  " fds for " + std::to_string(end - at) +
                                  " allocations, which have " + std::to_string(want));
      }
      if (!status.ok()) {
        fd_passing::close_fds(fds, fds.size());
        throw_status(status, backup ? "fds of host backups" : "fds of address-stable memory");
      }
      std::size_t next = 0;
      for (auto i = at; i < end; ++i) {
        all.emplace_back(fds.begin() + static_cast<std::ptrdiff_t>(next),
                         fds.begin() + static_cast<std::ptrdiff_t>(next + counts[i]));
        next += counts[i];
      }
      at = end;
    }
  } catch (...) {
    close_all();
    throw;
  }
  return all;
}

void unmap_backup(stable_memory_resource_impl::entry& e) noexcept
{
  if (e.backup_data == nullptr) { return; }
  if (e.backup_pinned && cudaHostUnregister(e.backup_data) != cudaSuccess) { cudaGetLastError(); }
  ::munmap(e.backup_data, e.bytes);
  e.backup_data   = nullptr;
  e.backup_serial = 0;
  e.backup_pinned = false;
}

void map_backups(session_impl& session,
                 std::vector<stable_memory_resource_impl::entry*> const& entries,
                 std::vector<std::uint64_t> const& serials)
{
  std::vector<std::size_t> missing;  // indices into entries
  std::vector<std::uint64_t> missing_ids;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    auto& e = *entries[i];
    // Serial 0: a daemon that numbers no backups; never take it for the same.
    if (e.backup_data != nullptr && serials[i] != 0 && e.backup_serial == serials[i]) { continue; }
    unmap_backup(e);  // another backup than the one mapped here
    missing.push_back(i);
    missing_ids.push_back(e.id);
  }
  if (missing.empty()) { return; }
  std::vector<std::size_t> const ones(missing_ids.size(), 1);
  auto fds         = fetch_fds(session, missing_ids, ones, true);
  std::size_t next = 0;  // fds from here on are still open
  try {
    for (std::size_t k = 0; k < missing.size(); ++k) {
      next     = k + 1;
      auto& e  = *entries[missing[k]];
      void* at = ::mmap(nullptr, e.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[k].front(), 0);
      ::close(fds[k].front());  // the mapping keeps the memfd
      if (at == MAP_FAILED) {
        throw rmm::bad_alloc("rmmd: mapping a host backup of " + std::to_string(e.bytes) +
                             " bytes failed (mmap)");
      }
      // Page-locked, a copy runs at the host link's speed; pageable, at a
      // fraction. Locking is most of a first sleep's cost: the mapping is
      // kept for the sleeps after it where the resource keeps backups.
      e.backup_pinned = cudaHostRegister(at, e.bytes, cudaHostRegisterDefault) == cudaSuccess;
      if (!e.backup_pinned) { cudaGetLastError(); }
      e.backup_data   = at;
      e.backup_serial = serials[missing[k]];
    }
  } catch (...) {
    for (auto k = next; k < fds.size(); ++k) { ::close(fds[k].front()); }
    throw;
  }
}

void copy_backups(std::vector<stable_memory_resource_impl::entry*> const& entries,
                  direction way,
                  cudaStream_t stream)
{
  try {
    for (auto* e : entries) {
      auto* device = reinterpret_cast<void*>(e->address);
      check(way == direction::to_host
                ? cudaMemcpyAsync(e->backup_data, device, e->size, cudaMemcpyDeviceToHost, stream)
                : cudaMemcpyAsync(device, e->backup_data, e->size, cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync of a host backup");
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after the backup copies");
  } catch (...) {
    cudaStreamSynchronize(stream);  // nothing may still copy into what the caller unmaps
    cudaGetLastError();
    throw;
  }
}

void read_backup(int fd, std::size_t fd_bytes, std::size_t offset, std::size_t bytes, void* out)
{
  void* data = ::mmap(nullptr, fd_bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the memfd
  if (data == MAP_FAILED) {
    throw rmm::bad_alloc("rmmd: mapping a host backup of " + std::to_string(fd_bytes) +
                         " bytes failed (mmap)");
  }
  std::memcpy(out, static_cast<std::byte const*>(data) + offset, bytes);
  ::munmap(data, fd_bytes);
}

}  // namespace rmmd::detail::stable
