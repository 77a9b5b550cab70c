#pragma once

// What rmmd::stable_memory_resource does with the driver and the daemon's
// fds, apart from its bookkeeping: reserving and freeing address ranges,
// mapping an allocation's fd at its range and unmapping it, fetching fds
// over the session socket, mapping host backups (memfds, page-locked) into
// an entry and copying between an allocation and its backup. Stateless;
// each function throws as error.hpp says and leaves nothing behind when it
// throws.

#include <rmmd/detail/stable_memory_resource_impl.hpp>

#include "client/detail/session_impl.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace rmmd::detail::stable {

/// A range of `bytes` reserved for device `device`'s allocations.
std::uintptr_t reserve(std::size_t bytes);
void unreserve(std::uintptr_t address, std::size_t bytes) noexcept;

/// Imports `fds` (closing every one, whatever happens) and maps them one
/// after another read-write for `device` from `e.address`: one fd per
/// piece of `piece_bytes` (the daemon's StableAllocation.piece_bytes;
/// empty: one piece of e.bytes). Sets e.handles, e.pieces and e.mapped.
void map(stable_memory_resource_impl::entry& e,
         std::vector<int> fds,
         std::span<std::uint64_t const> piece_bytes,
         int device);
/// Unmaps and releases the imports (where mapped).
void unmap(stable_memory_resource_impl::entry& e) noexcept;

/// The fds of `ids` from the daemon: of their memory (`counts[i]` for id
/// i: its pieces) or of their backups (one each), in calls of at most 250
/// fds; out[i] holds id i's. The caller closes them.
std::vector<std::vector<int>> fetch_fds(session_impl& session,
                                        std::span<std::uint64_t const> ids,
                                        std::span<std::size_t const> counts,
                                        bool backup);

/// How many fds an allocation of `piece_bytes` (StableAllocation.piece_bytes) has.
[[nodiscard]] inline std::size_t fd_count(std::span<std::uint64_t const> piece_bytes) noexcept
{
  return piece_bytes.empty() ? 1 : piece_bytes.size();
}

/// Which way a copy goes.
enum class direction { to_host, to_device };

/// Maps each entry's host backup here (page-locked where the driver
/// allows) as the daemon's backup `serials[i]`: a mapping kept from an
/// earlier sleep or wake serves again while it is that backup; otherwise it
/// is dropped and the daemon's fd fetched and mapped.
void map_backups(session_impl& session,
                 std::vector<stable_memory_resource_impl::entry*> const& entries,
                 std::vector<std::uint64_t> const& serials);
/// Drops the entry's backup mapping (if any).
void unmap_backup(stable_memory_resource_impl::entry& e) noexcept;

/// Copies each entry's `size` bytes between its range and its mapped backup
/// (map_backups), on `stream`, and waits for it.
void copy_backups(std::vector<stable_memory_resource_impl::entry*> const& entries,
                  direction way,
                  cudaStream_t stream);

/// Copies `bytes` bytes at `offset` of a backup's fd (of `fd_bytes`, mapped
/// here read-only meanwhile) into `out`. Closes the fd.
void read_backup(int fd, std::size_t fd_bytes, std::size_t offset, std::size_t bytes, void* out);

/// Throws rmm::bad_alloc naming `what` and the CUDA error, unless success.
void check(cudaError_t err, char const* what);

}  // namespace rmmd::detail::stable
