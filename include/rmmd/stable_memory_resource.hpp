#pragma once

#include <rmmd/detail/stable_memory_resource_impl.hpp>
#include <rmmd/session.hpp>

#include <cuda/memory_resource>

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd {

/// Device memory at addresses that stay the same across sleep and wake
/// (docs/sleep.md). Each allocation is memory of its own that the daemon
/// makes in one of its CUDA pools (cuMemCreate) and exports by a posix fd;
/// this process reserves a range of virtual addresses for it
/// (cuMemAddressReserve), keeps the range for the allocation's life, and
/// maps the daemon's memory there while the allocation is awake. The
/// daemon's ledger, quotas and tenant pools count it as a lease.
///
/// Every allocation carries a tag: the one a scoped_stable_tag on the
/// calling thread sets, else the resource's default tag. sleep(tags) gives
/// the memory of those tags back to the node (another uid may be lent it),
/// keeping a host copy where asked; wake(tags) maps new memory at the same
/// addresses and restores the copies, so pointers and CUDA graphs captured
/// before the sleep stay valid. Empty tags: every tag of this resource.
///
/// A copyable handle over shared state, like RMM's resources: pass it to
/// rmm::device_uvector, rmm::device_buffer or any RMM adaptor.
///
/// allocate() returns memory ready on any stream (one daemon round trip and
/// one fd round trip each: for few, large allocations, as the engines'
/// weights and KV caches are); allocate(0) returns nullptr.
/// deallocate() synchronises its stream before it unmaps, never throws,
/// ignores nullptr, and does nothing while the process exits.
///
/// Throws (allocate, sleep, wake, restore): rmm::out_of_memory (quota, pool,
/// device; a wake that did not fit by its deadline, naming who holds the
/// pool), rmmd::logic_error (bad size or tag; a host pool),
/// rmmd::precondition_error (no host pool for a backup; a sleep or wake
/// under way), rmmd::not_found_error (restore of an unknown name),
/// rmmd::session_error (daemon gone), rmm::bad_alloc (a CUDA error, named).
///
/// Thread safety: every member may be called from any thread; a sleep or a
/// wake holds the resource's lock throughout (allocations wait for it).
class stable_memory_resource final
    : public cuda::mr::shared_resource<detail::stable_memory_resource_impl> {
  using shared_base = cuda::mr::shared_resource<detail::stable_memory_resource_impl>;

 public:
  /// The pool on CUDA device `device` (this process's ordinal).
  stable_memory_resource(session s, int device, std::string default_tag = "default")
      : shared_base(cuda::std::in_place_type<detail::stable_memory_resource_impl>,
                    s,
                    s.device_pool(device),
                    std::move(default_tag))
  {
  }

  /// The CUDA pool named `pool_name` (as `rmmctl stats` shows it).
  stable_memory_resource(session s, std::string_view pool_name, std::string default_tag)
      : shared_base(cuda::std::in_place_type<detail::stable_memory_resource_impl>,
                    s,
                    s.pool(pool_name),
                    std::move(default_tag))
  {
  }

  /// An allocation tagged `tag`, whatever the thread's scope says.
  void* allocate_tagged(std::string const& tag, std::size_t bytes)
  {
    return get().allocate_tagged(tag, bytes);
  }

  /// Waits for the device's work, copies what `backup` keeps of the
  /// allocations tagged with one of `tags` (on `stream`, into host memory
  /// the daemon holds), waits for the copies, unmaps them (keeping their
  /// addresses) and gives their memory back to the pool. With a
  /// `backup_name`, the copies outlive this process: a process of the same
  /// uid restore()s them after it ended. Returns the device bytes given back.
  std::size_t sleep(std::vector<std::string> const& tags = {},
                    sleep_backup backup                  = sleep_backup::none,
                    std::string const& backup_name       = {},
                    cudaStream_t stream                  = nullptr)
  {
    return get().sleep(tags, backup, backup_name, stream);
  }

  /// Maps new memory at the same addresses for the sleeping allocations
  /// tagged with one of `tags`, all or none, and restores their copies (on
  /// `stream`, waited for). A wake that does not fit waits up to `deadline`
  /// for memory to come back, then throws rmm::out_of_memory with nothing
  /// mapped. Returns the bytes woken.
  std::size_t wake(std::vector<std::string> const& tags = {},
                   std::chrono::milliseconds deadline   = std::chrono::seconds(10),
                   cudaStream_t stream                  = nullptr)
  {
    return get().wake(tags, deadline, stream);
  }

  /// The allocations a process of this uid left asleep under `backup_name`
  /// when it ended: woken at new addresses of this process and restored.
  /// Free them with deallocate() like any other.
  std::vector<restored_allocation> restore(
      std::string const& backup_name,
      std::chrono::milliseconds deadline = std::chrono::seconds(10),
      cudaStream_t stream                = nullptr)
  {
    return get().restore(backup_name, deadline, stream);
  }

  /// Copies `bytes` bytes at `ptr`, inside one of this resource's
  /// allocations that sleeps with a host backup, from that backup into
  /// `out` (host memory); returns false, copying nothing, where that
  /// allocation is awake or sleeps without a backup (torch_memory_saver's
  /// get_cpu_backup). Throws rmmd::not_found_error where [ptr, ptr + bytes)
  /// is not inside one of this resource's allocations.
  bool read_backup(void const* ptr, std::size_t bytes, void* out) const
  {
    return get().read_backup(ptr, bytes, out);
  }

  /// Whether a wake keeps the host backups it restored from (true, the
  /// default): they stay, mapped and page-locked here and charged to the
  /// host pool and the uid's quota while their allocations are awake, as
  /// the room the next sleep with a backup copies into, so that from the
  /// second sleep on a sleep and a wake are the copies alone, at the host
  /// link's speed (the first page-locks, which costs most). false: a wake
  /// gives the host memory back, and every sleep pays the page-locking
  /// again. A kept room is not a backup to restore: only a sleeping
  /// allocation's backup is.
  void keep_backups(bool keep) noexcept
  {
    get().keep_backups(keep);
  }
  [[nodiscard]] bool keeps_backups() const noexcept
  {
    return get().keeps_backups();
  }

  /// The tag of the allocation at `ptr` (empty: none of this resource's).
  [[nodiscard]] std::string tag_of(void const* ptr) const
  {
    return get().tag_of(ptr);
  }
  /// Whether the allocation at `ptr` is mapped now.
  [[nodiscard]] bool is_awake(void const* ptr) const
  {
    return get().is_awake(ptr);
  }

  [[nodiscard]] session const& get_session() const noexcept
  {
    return get().get_session();
  }
  [[nodiscard]] pool_info const& pool() const noexcept
  {
    return get().pool();
  }

  friend void get_property(stable_memory_resource const&, cuda::mr::device_accessible) noexcept {}
};

static_assert(
    cuda::mr::synchronous_resource_with<stable_memory_resource, cuda::mr::device_accessible>);
static_assert(cuda::mr::resource_with<stable_memory_resource, cuda::mr::device_accessible>);

}  // namespace rmmd
