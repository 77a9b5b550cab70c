#pragma once

// Packed leases (AllocateRequest.may_pack), as rmmd::ipc_memory_resource's
// direct path meets them: the daemon carves small CUDA allocations out of
// 2 MiB blocks leased to this session alone, and this process imports each
// block once, whichever resource of the session its leases go to. One object
// per session (the blocks are the session's); ipc_memory_resource is its only
// user, besides the session's channel, which reports grants, Frees and the
// daemon's RetireBlocks.
//
// Owns: the imports of the blocks (freed when the daemon retires a block, or
// by the destructor), the count of live packed leases per block, and one
// non-blocking stream per device on which retired blocks' imports are freed.
//
// Locks: imports_mutex_ guards imports_ and drop_streams_, held across a
// block's import (once per block) and a drop. live_mutex_ guards the live
// counts; a leaf, taken inside imports_mutex_ or alone. Neither is held
// while the channel's call_mutex_ is waited for (drop_block calls are queued).

#include <rmmd/session.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace rmmd::detail {

class pool_mappings;
class session_channel;

class packed_block_imports {
 public:
  /// Both outlive this object.
  packed_block_imports(session_channel& channel, pool_mappings& pools) noexcept
      : channel_(channel), pools_(pools)
  {
  }
  packed_block_imports(packed_block_imports const&)            = delete;
  packed_block_imports& operator=(packed_block_imports const&) = delete;
  /// Frees every block's import and waits for it (not while the process
  /// exits). REQUIRES: the channel's reader thread has stopped.
  ~packed_block_imports();

  /// The address of packed block `block` of CUDA pool `pool_id` in this
  /// process: imported from `export_data` (cudaMemPoolPtrExportData) the
  /// first time, and kept until the daemon retires the block (RetireBlocks)
  /// or the session ends. Throws rmm::bad_alloc when the import fails.
  void* base(std::uint32_t pool_id, std::uint64_t block, void const* export_data);

  /// Lease `lease` is live in packed block `block` from its grant until its
  /// Free is sent (once, however often said; not at all when memory runs
  /// out): a RetireBlocks naming a block with live leases (a daemon's bug)
  /// is not obeyed.
  void count_lease(std::uint64_t lease, std::uint64_t block) noexcept;
  /// Lease `lease` is no longer live in its packed block (if it is in one):
  /// its Free is about to be sent. Returns that block, or 0.
  std::uint64_t forget_lease(std::uint64_t lease) noexcept;

  /// The daemon retired `blocks`: frees this process's import of each (in
  /// the order of a stream of ours, waited for), then tells the daemon
  /// (BlocksDropped, queued like a Free). Takes no lock of the channel's.
  void drop(std::vector<std::uint64_t> const& blocks) noexcept;

  /// The daemon of generation `old` went away (the session reconnected):
  /// frees the imports of its blocks with no live lease. A block with live
  /// leases keeps its import until the session ends (its memory stays
  /// valid). Block ids are client ids (session_channel.hpp), so a new
  /// daemon's blocks never meet an old one's.
  void forget_generation(std::uint32_t old) noexcept;

 private:
  struct import {
    void* base{};
    std::uint32_t pool_id{};
  };
  /// Takes block `block` out of imports_ for drop(): false when it stays
  /// (leases still live in it) or was never imported (then its drop is
  /// queued at once). Sets the stream and device to free it on.
  bool take_for_drop(std::uint64_t block, import& out, cudaStream_t& stream, int& device) noexcept;
  /// The non-blocking stream of `device` for drops (null when CUDA refuses).
  /// Holds imports_mutex_.
  cudaStream_t drop_stream_locked(int device) noexcept;
  /// Tells the daemon (queued) that block `block` is dropped.
  void say_dropped(std::uint64_t block) noexcept;

  session_channel& channel_;
  pool_mappings& pools_;
  std::mutex imports_mutex_;
  std::unordered_map<std::uint64_t, import> imports_;   // by block id
  std::unordered_map<int, cudaStream_t> drop_streams_;  // by device; non-blocking
  std::mutex live_mutex_;
  std::unordered_map<std::uint64_t, std::uint64_t> lease_block_;  // lease -> block
  std::unordered_map<std::uint64_t, std::size_t> block_live_;     // block -> leases
};

}  // namespace rmmd::detail
