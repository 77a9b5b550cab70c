#pragma once

#include <rmmd/detail/lease_table.hpp>
#include <rmmd/session.hpp>

#include <cuda/memory_resource>
#include <cuda/stream>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rmmd {

/// How rmmd::ipc_memory_resource gets memory from the daemon.
enum class allocation_mode {
  /// One daemon allocation per allocate(): an RPC, a pointer export and an
  /// import each (tens of microseconds), and the daemon's ledger shows every
  /// buffer. For few, large or long-lived buffers.
  direct,
  /// The resource leases slabs through the direct path and carves allocations
  /// out of them in-process with RMM's pool_memory_resource (stream-ordered
  /// reuse, no daemon round trip): about as fast as an in-process RMM pool.
  /// The daemon counts slabs; the resource reports what it carved. Idle slabs
  /// go back after `idle_trim`, or at once when the daemon reports pressure.
  slab,
};

/// Whether rmmd::ipc_memory_resource asks CUDA, on each allocate() and
/// deallocate(), if the stream is capturing a graph (ipc_resource_options::
/// capture; rmmd::ipc_memory_resource's "Stream capture" says what each does).
enum class capture_checks {
  /// Direct mode: every_call. Slab mode: slow_path_only.
  automatic,
  /// Graph-safe: every allocate() and deallocate() asks CUDA (cuStreamIsCapturing,
  /// about 30 ns each). An allocation during capture is a lease of its own,
  /// and memory freed during capture stays the graph's until the graph is
  /// destroyed. Use it when a captured graph frees memory it (or anyone)
  /// allocated and later work must not reuse that memory under the graph.
  every_call,
  /// Slab mode: the fast path asks nothing, and carving under capture does
  /// what RMM's pool_memory_resource does (memory freed during capture goes
  /// back to the slab at once); only paths that would lease from the daemon
  /// ask. Direct mode ignores it and checks every call: there a free sends a
  /// message, which a graph would send again at every replay.
  slow_path_only,
};

/// ipc_resource_options::carving_lanes: a lane per thread that allocates,
/// made when a second thread comes.
inline constexpr std::size_t auto_carving_lanes = 0;

struct ipc_resource_options {
  allocation_mode mode{allocation_mode::slab};
  /// The first slab; later ones are sized as RMM's pool grows (at least the
  /// request, at most the pool's size so far).
  std::size_t slab_bytes{std::size_t{64} << 20};
  /// Slabs go back to the daemon once nothing has been carved from them for
  /// this long.
  std::chrono::milliseconds idle_trim{std::chrono::seconds(5)};
  /// Slab mode: how many RMM pools ("carving lanes") may carve. Each thread's
  /// allocations are carved by one lane (threads take lanes round-robin as
  /// they first allocate), so that threads allocating at once do not queue
  /// on one pool's mutex: with 8 threads one pool makes every pair wait
  /// (about 15 us a pair against 1.6 us with 8 lanes, section a8 of the
  /// bench). Each lane leases slabs of its own (`slab_bytes` first), so more
  /// lanes hold more idle memory; a lane's slabs go back on the same terms
  /// as any slab (`idle_trim`, or when the daemon asks), and show in the
  /// session's idle and reclaimable bytes (`rmmctl stats`). A pointer may be
  /// freed by any thread, on any stream.
  ///
  /// auto_carving_lanes (the default): one lane while one thread allocates
  /// (the fast path as with one lane), a lane per allocating thread from
  /// the moment a second thread allocates, up to as many lanes as the
  /// process has CPUs (its affinity set), at most 16; threads beyond that
  /// share lanes. 1 to 16: that many lanes, per thread from the first
  /// allocation (1: every thread carves from one pool).
  std::size_t carving_lanes{auto_carving_lanes};
  /// Whether allocate() and deallocate() look for stream capture (CUDA
  /// graphs) on every call; see capture_checks.
  capture_checks capture{capture_checks::automatic};
  /// Allocations larger than this are not pointers of the pool but
  /// allocations of their own: a VMM allocation the daemon makes and exports
  /// by an fd of its own, mapped here at addresses this process reserves (as
  /// rmmd::stable_memory_resource does, under the tag "large-allocation"),
  /// and counted by the daemon like any lease. The driver of CUDA 13.0
  /// kills a process that imports a pool pointer of about 5.5 GiB or more
  /// (SIGSEGV in cudaMemPoolImportPointer, 5 GiB works: an H200,
  /// bench/experiments/large_pool_import.cu). Such an allocation costs a
  /// few round trips and a mapping, and its deallocate() waits for its
  /// stream (unmapping is not stream-ordered). Slab mode never leases a
  /// slab larger than this either. `slab_bytes` must not exceed it.
  std::size_t own_allocation_above{std::size_t{4} << 30};
};

}  // namespace rmmd

namespace rmmd::detail {

class slab_carver;
class stable_memory_resource_impl;
struct graph_held_frees;

/// The frees of one resource that wait for their stream (shared with the host
/// functions that complete them, which may outlive the resource at exit).
struct pending_releases {
  std::mutex mutex;
  std::condition_variable done;
  std::size_t count{};  // guarded by mutex
};

/// The shared state behind rmmd::ipc_memory_resource. Not copyable.
class ipc_memory_resource_impl {
 public:
  /// REQUIRES: `pool` is one of `s`'s CUDA pools. Imports it (once per session).
  /// Throws rmmd::logic_error when this process cannot see the pool's GPU.
  ipc_memory_resource_impl(session s, pool_info const& pool, ipc_resource_options options = {});
  ipc_memory_resource_impl(ipc_memory_resource_impl const&)            = delete;
  ipc_memory_resource_impl& operator=(ipc_memory_resource_impl const&) = delete;
  /// Frees what is still allocated through it (never throws; no CUDA call
  /// and no message while the process exits).
  ~ipc_memory_resource_impl();

  [[nodiscard]] void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment);
  void deallocate(cuda::stream_ref stream,
                  void* ptr,
                  std::size_t bytes,
                  std::size_t alignment) noexcept;
  [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment);
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept;

  [[nodiscard]] bool operator==(ipc_memory_resource_impl const& other) const noexcept
  {
    return this == &other;
  }

  [[nodiscard]] session const& get_session() const noexcept
  {
    return session_;
  }
  [[nodiscard]] pool_info const& pool() const noexcept
  {
    return pool_;
  }
  [[nodiscard]] ipc_resource_options const& options() const noexcept
  {
    return options_;
  }

  /// The direct path: one daemon allocation, imported (slab mode leases its
  /// slabs through these).
  [[nodiscard]] void* lease(cuda::stream_ref, std::size_t bytes, std::size_t alignment)
  {
    return lease_into(leases_, bytes, alignment);
  }
  void unlease(cuda::stream_ref stream, void* ptr) noexcept;
  /// The same for slab mode's slabs, which it also counts by the daemon that
  /// lent them (see slab_bytes_not_lent_by()).
  [[nodiscard]] void* lease_slab(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment);
  void unlease_slab(cuda::stream_ref stream, void* ptr) noexcept;
  /// The bytes of the slabs held that the daemon of `generation` did not
  /// lend (those of daemons the session reconnected away from, or of one it
  /// reconnected to since): they carve on, but a usage report to that
  /// daemon leaves them out.
  [[nodiscard]] std::size_t slab_bytes_not_lent_by(std::uint32_t generation) const noexcept;

  /// Slab mode: gives idle slabs back now; returns the bytes given back (0
  /// when something is still carved from them, or in direct mode).
  std::size_t trim() noexcept;

  friend void get_property(ipc_memory_resource_impl const&, cuda::mr::device_accessible) noexcept {}

 private:
  /// A daemon allocation, imported, entered in `table`.
  [[nodiscard]] void* lease_into(lease_table& table,
                                 std::size_t bytes,
                                 std::size_t alignment,
                                 std::uint32_t* generation = nullptr);
  /// Under capture_checks::slow_path_only the carver asks for capture where
  /// it would lease a slab, and hands such an allocation to allocate_captured().
  friend class slab_carver;
  /// allocate() on a stream that is capturing a graph: a lease of its own in
  /// both modes (made by the daemon, so ready without any event), made in the
  /// relaxed capture mode. Never carved: RMM's pool would make the capture
  /// wait on events recorded outside it, which CUDA refuses.
  [[nodiscard]] void* allocate_captured(std::size_t bytes, std::size_t alignment);
  /// deallocate() on a stream that is capturing into `graph`: the graph keeps
  /// the memory until it and its executable graphs are destroyed; then the
  /// next call into this resource frees it (release_graph_held()).
  /// `taken`: its lease id, already taken from its table (a lease of its own
  /// made during capture, freed during capture under slow_path_only).
  void hold_for_graph(cudaGraph_t graph,
                      void* ptr,
                      std::size_t bytes,
                      std::size_t alignment,
                      std::optional<std::uint64_t> taken = std::nullopt) noexcept;
  /// An allocation larger than options_.own_allocation_above: one of its
  /// own, mapped here (made in the relaxed capture mode).
  [[nodiscard]] void* allocate_own(std::size_t bytes);
  /// Frees what destroyed graphs held, on a stream of this resource's own.
  void release_graph_held() noexcept;
  /// deallocate() on a stream that is not capturing.
  void deallocate_now(cuda::stream_ref stream,
                      void* ptr,
                      std::size_t bytes,
                      std::size_t alignment) noexcept;
  /// Frees the import on `stream`, then has the daemon free the lease once
  /// the stream passes that point: a host function enqueued after the free
  /// sends the Free (no interprocess event, so any uid and any /dev/shm).
  void release(cudaStream_t stream, void* ptr, std::uint64_t id) noexcept;
  /// Waits until no free of this resource waits for its stream; false at
  /// the deadline.
  bool wait_for_releases(std::chrono::steady_clock::time_point deadline) noexcept;

  session session_;
  pool_info pool_;
  ipc_resource_options options_;
  /// Direct mode, or capture_checks::every_call: allocate() and deallocate()
  /// ask whether their stream captures. Else only slow paths ask.
  bool checks_every_call_;
  cudaMemPool_t imported_{};
  std::uint32_t imported_generation_{};  // the daemon imported_ came from
  /// Slab mode: each slab's daemon (generation) and bytes.
  mutable std::mutex slabs_mutex_;
  std::unordered_map<void*, std::pair<std::uint32_t, std::size_t>> slabs_;
  lease_table leases_;
  std::shared_ptr<pending_releases> pending_ = std::make_shared<pending_releases>();
  /// Watching for exit again at the first lease covers a resource in a
  /// function-local static, whose destructor is registered after its
  /// constructor ran (and would run before a hook registered there).
  std::once_flag exit_watched_;
  /// Slab mode: the leases made while their stream captured (not carved),
  /// and how many (deallocate() looks them up only when there are any).
  lease_table captured_;
  std::atomic<std::size_t> captured_count_{0};
  /// Frees made during capture that the graphs holding them let go of.
  std::shared_ptr<graph_held_frees> graph_held_;
  /// The stream release_graph_held() frees on (made at its first use).
  std::once_flag own_stream_made_;
  cudaStream_t own_stream_{};
  /// The allocations of their own (allocate_own()), made at the first.
  std::once_flag own_made_;
  std::unique_ptr<stable_memory_resource_impl> own_;
  std::unique_ptr<slab_carver> carver_;  // slab mode only; destroyed first
};

}  // namespace rmmd::detail
