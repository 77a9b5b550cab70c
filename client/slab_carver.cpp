#include "client/slab_carver.hpp"

#include "client/detail/cuda_state.hpp"
#include "client/detail/session_impl.hpp"

#include <rmmd/error.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>

namespace rmmd::detail {
namespace {

/// The session_error of the last slab lease that failed on this thread: RMM's
/// pool reports every upstream failure as rmm::out_of_memory, and
/// slab_carver::allocate() turns it back into what it was (the pool calls its
/// upstream on the allocating thread).
thread_local std::exception_ptr failed_lease;

/// What the pool leases its slabs from: the owning resource's direct path.
/// Copyable (RMM keeps it in an any_resource); the owner outlives the pool.
class direct_upstream {
 public:
  direct_upstream(ipc_memory_resource_impl* owner, std::atomic<std::size_t>* slab_bytes)
      : owner_(owner), slab_bytes_(slab_bytes)
  {
  }

  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
  {
    try {
      void* ptr = owner_->lease(stream, bytes, alignment);
      slab_bytes_->fetch_add(bytes, std::memory_order_relaxed);
      return ptr;
    } catch (rmmd::session_error const&) {
      failed_lease = std::current_exception();
      throw;
    }
  }
  void deallocate(cuda::stream_ref stream, void* ptr, std::size_t bytes, std::size_t) noexcept
  {
    owner_->unlease(stream, ptr);
    slab_bytes_->fetch_sub(bytes, std::memory_order_relaxed);
  }
  void* allocate_sync(std::size_t bytes, std::size_t alignment)
  {
    return allocate(cuda::stream_ref{cudaStreamLegacy}, bytes, alignment);
  }
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept
  {
    deallocate(cuda::stream_ref{cudaStreamLegacy}, ptr, bytes, alignment);
  }
  bool operator==(direct_upstream const& other) const noexcept
  {
    return owner_ == other.owner_;
  }

  friend void get_property(direct_upstream const&, cuda::mr::device_accessible) noexcept {}

 private:
  ipc_memory_resource_impl* owner_;
  std::atomic<std::size_t>* slab_bytes_;
};

static_assert(cuda::mr::resource_with<direct_upstream, cuda::mr::device_accessible>);

/// RMM's pool carves at this alignment; larger ones it would not honour.
constexpr std::size_t max_alignment = 256;

}  // namespace

slab_carver::slab_carver(ipc_memory_resource_impl& owner)
    : owner_(owner),
      reclaim_watch_(owner.get_session().watch_reclaims(owner.pool().id,
                                                        [this](std::uint32_t) {
                                                          {
                                                            std::lock_guard lock(keeper_mutex_);
                                                            reclaim_asked_ = true;
                                                          }
                                                          keeper_wake_.notify_all();
                                                        })),
      keeper_([this](std::stop_token stop) { keep(std::move(stop)); })
{
}

void slab_carver::abandon() noexcept
{
  owner_.get_session().unwatch_reclaims(reclaim_watch_);
  if (keeper_.joinable()) {
    keeper_.request_stop();
    keeper_.join();
  }
  std::lock_guard lock(pool_mutex_);
  users_.fetch_or(closed, std::memory_order_relaxed);
  static_cast<void>(pool_.release());
}

slab_carver::~slab_carver()
{
  owner_.get_session().unwatch_reclaims(reclaim_watch_);
  if (keeper_.joinable()) {
    keeper_.request_stop();
    keeper_.join();
  }
  if (leave_everything()) {
    // No CUDA or gRPC calls now: the daemon reclaims the slabs with the session.
    static_cast<void>(pool_.release());
    return;
  }
  // The session's other resources of this pool report on without this one.
  owner_.get_session().impl().forget_reporter(this, owner_.pool().id);
  trim();
  if (auto const left = carved(); pool_ != nullptr && left.count != 0) {
    std::fprintf(stderr,
                 "rmmd: an ipc_memory_resource of pool '%s' was destroyed with %zu allocations "
                 "(%zu bytes) still carved; its slabs stay leased until the session closes\n",
                 owner_.pool().name.c_str(),
                 left.count,
                 left.bytes);
    static_cast<void>(pool_.release());
  }
}

slab_carver::carved_figures slab_carver::carved() const noexcept
{
  auto const word = users_.load(std::memory_order_relaxed);
  return {.count = static_cast<std::size_t>((word & count_mask) >> count_shift),
          .bytes = static_cast<std::size_t>((word & units_mask) << unit_shift)};
}

void slab_carver::open_pool()
{
  std::lock_guard lock(pool_mutex_);
  if ((users_.load(std::memory_order_relaxed) & closed) == 0) { return; }  // another thread did
  if (pool_ == nullptr) {
    // The first slab is leased here; later ones as RMM's pool grows.
    pool_ = std::make_unique<rmm::mr::pool_memory_resource>(direct_upstream{&owner_, &slab_bytes_},
                                                            owner_.options().slab_bytes);
  }
  // Release: a carving call that sees the bit clear sees pool_.
  users_.fetch_and(~closed, std::memory_order_release);
}

void* slab_carver::allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
{
  if (alignment > max_alignment) {
    throw rmmd::logic_error("rmmd: allocate " + std::to_string(bytes) + " bytes from pool '" +
                            owner_.pool().name + "': alignment " + std::to_string(alignment) +
                            " is larger than the 256 bytes CUDA pools guarantee");
  }
  auto const mine = carving(bytes);
  try {
    for (;;) {
      // Counted before the pool is touched, so trim() cannot take it meanwhile.
      if ((users_.fetch_add(mine, std::memory_order_acquire) & closed) == 0) [[likely]] {
        try {
          return pool_->allocate(stream, bytes, alignment);
        } catch (...) {
          users_.fetch_sub(mine, std::memory_order_release);
          throw;
        }
      }
      users_.fetch_sub(mine, std::memory_order_release);
      open_pool();
    }
  } catch (rmm::out_of_memory const&) {
    // A slab lease failed because the session is over (the daemon is gone),
    // not because memory ran out: say so, as the direct mode does.
    if (auto lost = std::exchange(failed_lease, nullptr)) { std::rethrow_exception(lost); }
    throw;
  } catch (...) {
    failed_lease = nullptr;  // set only on the way to a throw: cleared there, not per call
    throw;
  }
}

void slab_carver::deallocate(cuda::stream_ref stream,
                             void* ptr,
                             std::size_t bytes,
                             std::size_t alignment) noexcept
{
  // `ptr` is counted in users_ until the end of this call: pool_ stays.
  if (pool_ == nullptr) { return; }  // abandoned, or destroyed with this still carved
  pool_->deallocate(stream, ptr, bytes, alignment);
  users_.fetch_sub(carving(bytes), std::memory_order_release);
}

std::size_t slab_carver::trim() noexcept
{
  std::unique_ptr<rmm::mr::pool_memory_resource> idle;
  {
    std::lock_guard lock(pool_mutex_);
    if (pool_ == nullptr) { return 0; }
    // Only a count of zero closes: nothing carved, no allocate() under way;
    // those that come now find it closed and wait for this lock.
    std::uint64_t idle_users = 0;
    if (!users_.compare_exchange_strong(idle_users, closed, std::memory_order_acquire)) {
      return 0;
    }
    idle = std::move(pool_);
  }
  auto const bytes = idle->pool_size();
  // On the pool's device (trim runs on the keeper and on users' threads),
  // whatever device the calling thread had current.
  int previous = 0;
  cudaGetDevice(&previous);
  auto const device = owner_.pool().device;
  if (previous != device) { cudaSetDevice(device); }
  struct restore_device {
    int device;
    bool needed;
    ~restore_device()
    {
      if (needed) { cudaSetDevice(device); }
    }
  } restore{previous, previous != device};
  // Work queued on any stream of that device may still use memory that was
  // carved and freed in stream order: let it finish before the slabs are freed
  // (each then goes back through the direct path, with a release event).
  if (auto err = cudaDeviceSynchronize(); err != cudaSuccess) {
    cudaGetLastError();
    static_cast<void>(idle.release());
    if (cuda_is_going(err)) { return 0; }
    std::fprintf(stderr,
                 "rmmd: trimming pool '%s': cudaDeviceSynchronize: %s; keeping the slabs\n",
                 owner_.pool().name.c_str(),
                 cudaGetErrorName(err));
    return 0;
  }
  try {
    idle.reset();
  } catch (std::exception const& e) {
    std::fprintf(stderr, "rmmd: trimming pool '%s': %s\n", owner_.pool().name.c_str(), e.what());
    return 0;
  }
  return bytes;
}

void slab_carver::keep(std::stop_token stop) noexcept
{
  using clock          = std::chrono::steady_clock;
  auto const idle_trim = owner_.options().idle_trim;
  auto const tick      = std::clamp<clock::duration>(
      idle_trim / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(250));
  // Its CUDA calls (trim) are for the pool's device.
  cudaSetDevice(owner_.pool().device);
  std::size_t reported_bytes = 0, reported_count = 0, reported_slabs = 0;
  auto last_report = clock::now();
  auto idle_since  = clock::now();
  bool reporting   = true;  // until the daemon is gone
  auto const pool  = owner_.pool().id;
  // What the daemon hears: carved bytes, the slabs, and the slabs it may ask
  // back (all of them while nothing is carved: RMM's pool gives back all or none).
  auto usage = [&](std::size_t bytes, std::size_t count, std::size_t slabs) {
    return carved_usage{.pool_id           = pool,
                        .bytes             = bytes,
                        .allocation_count  = count,
                        .slab_bytes        = slabs,
                        .reclaimable_bytes = count == 0 ? slabs : 0};
  };
  std::unique_lock lock(keeper_mutex_);
  while (!stop.stop_requested()) {
    keeper_wake_.wait_for(lock, stop, tick, [this] { return reclaim_asked_; });
    if (stop.stop_requested()) { break; }
    bool const asked = std::exchange(reclaim_asked_, false);
    // Not held while it works: the reclaim watch takes it to wake the keeper,
    // and runs on a thread (the session's reader, or a call's) that may hold
    // the session's watch list while this thread's report waits for it.
    lock.unlock();
    auto const now            = clock::now();
    auto const [count, bytes] = carved();
    auto const slabs          = slab_bytes_.load(std::memory_order_relaxed);
    bool holding              = false;
    {
      std::lock_guard pool_lock(pool_mutex_);
      holding = pool_ != nullptr;
    }
    if (count != 0) { idle_since = now; }
    // Asked by the daemon (another session waits): give back first, report after.
    bool pressed = asked;
    bool const changed =
        bytes != reported_bytes || count != reported_count || slabs != reported_slabs;
    if (!asked && reporting &&
        (changed || (holding && now - last_report >= std::chrono::seconds(1)))) {
      try {
        auto const trim_pools =
            owner_.get_session().impl().report_carved(this, usage(bytes, count, slabs));
        pressed        = std::find(trim_pools.begin(), trim_pools.end(), pool) != trim_pools.end();
        reported_bytes = bytes;
        reported_count = count;
        reported_slabs = slabs;
        last_report    = now;
      } catch (rmmd::session_error const&) {
        reporting = false;  // the daemon is gone; the next allocation says so
      } catch (std::exception const& e) {
        std::fprintf(stderr, "rmmd: %s\n", e.what());
        last_report = now;
      }
    }
    if (holding && count == 0 && (pressed || now - idle_since >= idle_trim)) {
      static_cast<void>(trim());
    }
    if (asked && reporting) {
      // What is left (nothing, or slabs something is carved from), so that
      // the daemon stops waiting for this session.
      auto const [left_count, left_bytes] = carved();
      auto const left_slabs               = slab_bytes_.load(std::memory_order_relaxed);
      try {
        static_cast<void>(owner_.get_session().impl().report_carved(
            this, usage(left_bytes, left_count, left_slabs)));
        reported_bytes = left_bytes;
        reported_count = left_count;
        reported_slabs = left_slabs;
        last_report    = now;
      } catch (std::exception const&) {
      }
    } else if (holding && slab_bytes_.load(std::memory_order_relaxed) != reported_slabs &&
               reporting) {
      // Trimmed: say so now rather than at the next tick.
      try {
        auto const left_slabs = slab_bytes_.load(std::memory_order_relaxed);
        auto const left       = carved();
        static_cast<void>(owner_.get_session().impl().report_carved(
            this, usage(left.bytes, left.count, left_slabs)));
        reported_slabs = left_slabs;
        last_report    = now;
      } catch (std::exception const&) {
      }
    }
    lock.lock();
  }
}

}  // namespace rmmd::detail
