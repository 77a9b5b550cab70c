#include "client/slab_carver.hpp"
#include "client/detail/stderr_line.hpp"

#include "client/detail/cuda_state.hpp"
#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "client/detail/stream_capture.hpp"

#include <rmmd/error.hpp>

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace rmmd::detail {
namespace {

/// The session_error of the last slab lease that failed on this thread: RMM's
/// pool reports every upstream failure as rmm::out_of_memory, and
/// slab_carver::allocate() turns it back into what it was (the pool calls its
/// upstream on the allocating thread).
thread_local std::exception_ptr failed_lease;

/// Where a trim (slab_carver::trim_lanes) parks the slabs that the pools it
/// destroys hand back, to give them back after RMM's pool has waited for
/// the streams that used them; null the rest of the time.
thread_local std::vector<void*>* parked_slabs = nullptr;

/// What a lane's pool leases its slabs from: the owning resource's direct
/// path. Copyable (RMM keeps it in an any_resource); the owner and the lane
/// outlive the pool.
class direct_upstream {
 public:
  /// `ranges`/`slots`: the lane's slab table, or null for the first lane
  /// (whose pointers are those no other lane holds).
  direct_upstream(ipc_memory_resource_impl* owner,
                  std::atomic<std::size_t>* slab_bytes,
                  std::atomic<std::uintptr_t>* ranges,
                  std::atomic<std::size_t>* slots,
                  std::size_t max_slabs)
      : owner_(owner),
        slab_bytes_(slab_bytes),
        ranges_(ranges),
        slots_(slots),
        max_slabs_(max_slabs)
  {
  }

  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
  {
    // No slab larger than a pool pointer can safely be: RMM's pool, refused
    // the size it grows by, asks for half as much, down to the request
    // (never larger than this: allocate() gave those their own).
    if (bytes > owner_->options().own_allocation_above) {
      throw rmm::out_of_memory("rmmd: a slab larger than own_allocation_above");
    }
    // A lane's table has room for max_slabs: past that its pool does not
    // grow, and allocate() carves from the first lane instead.
    std::size_t slot = max_slabs_;
    if (ranges_ != nullptr) {
      for (std::size_t i = 0; i < max_slabs_; ++i) {
        if (ranges_[2 * i].load(std::memory_order_relaxed) == 0) {
          slot = i;
          break;
        }
      }
      if (slot == max_slabs_) {
        throw rmm::out_of_memory("rmmd: this carving lane holds as many slabs as it can track");
      }
    }
    try {
      void* ptr = owner_->lease_slab(stream, bytes, alignment);
      slab_bytes_->fetch_add(bytes, std::memory_order_relaxed);
      if (ranges_ != nullptr) {
        // The end first: a reader that sees the begin sees its end.
        auto const begin = reinterpret_cast<std::uintptr_t>(ptr);
        ranges_[2 * slot + 1].store(begin + bytes, std::memory_order_release);
        ranges_[2 * slot].store(begin, std::memory_order_release);
        if (slots_->load(std::memory_order_relaxed) <= slot) {
          slots_->store(slot + 1, std::memory_order_release);
        }
      }
      return ptr;
    } catch (rmmd::session_error const&) {
      failed_lease = std::current_exception();
      throw;
    }
  }
  void deallocate(cuda::stream_ref stream, void* ptr, std::size_t bytes, std::size_t) noexcept
  {
    if (ranges_ != nullptr) {
      auto const begin = reinterpret_cast<std::uintptr_t>(ptr);
      for (std::size_t i = 0; i < max_slabs_; ++i) {
        if (ranges_[2 * i].load(std::memory_order_relaxed) == begin) {
          ranges_[2 * i].store(0, std::memory_order_release);
          ranges_[2 * i + 1].store(0, std::memory_order_release);
          break;
        }
      }
    }
    if (parked_slabs != nullptr) {
      try {
        parked_slabs->push_back(ptr);
        slab_bytes_->fetch_sub(bytes, std::memory_order_relaxed);
        return;
      } catch (std::bad_alloc const&) {
        // Given back at once, as a pool outside a trim does.
      }
    }
    owner_->unlease_slab(stream, ptr);
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
    return owner_ == other.owner_ && slab_bytes_ == other.slab_bytes_;
  }

  friend void get_property(direct_upstream const&, cuda::mr::device_accessible) noexcept {}

 private:
  ipc_memory_resource_impl* owner_;
  std::atomic<std::size_t>* slab_bytes_;
  std::atomic<std::uintptr_t>* ranges_;
  std::atomic<std::size_t>* slots_;
  std::size_t max_slabs_;
};

static_assert(cuda::mr::resource_with<direct_upstream, cuda::mr::device_accessible>);

/// RMM's pool carves at this alignment; larger ones it would not honour.
constexpr std::size_t max_alignment = 256;

}  // namespace

namespace {
std::size_t checked_lanes(ipc_memory_resource_impl const& owner)
{
  auto const n = owner.options().carving_lanes;
  if (n == auto_carving_lanes) { return slab_carver::auto_lanes(); }
  if (n > slab_carver::max_lanes) {
    throw rmmd::logic_error("rmmd: carving_lanes is " + std::to_string(n) + "; it must be 1 to " +
                            std::to_string(slab_carver::max_lanes) +
                            ", or rmmd::auto_carving_lanes (0: a lane per thread that allocates)");
  }
  return n;
}
}  // namespace

std::size_t slab_carver::auto_lanes() noexcept
{
  // The CPUs this process may run on (a container's or taskset's set), as
  // many threads as can carve at once.
  std::size_t cpus = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    cpus = static_cast<std::size_t>(CPU_COUNT(&set));
  }
  if (cpus == 0) { cpus = std::thread::hardware_concurrency(); }
  return std::clamp<std::size_t>(cpus, 1, max_lanes);
}

bool slab_carver::lane::holds(std::uintptr_t p) const noexcept
{
  auto const n = slots.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    auto const begin = ranges[2 * i].load(std::memory_order_acquire);
    if (begin == 0 || p < begin) { continue; }
    auto const end = ranges[2 * i + 1].load(std::memory_order_acquire);
    // The begin read again: a slot cleared and filled between the two reads
    // would pair an old begin with a new end.
    if (p < end && ranges[2 * i].load(std::memory_order_acquire) == begin) { return true; }
  }
  return false;
}

slab_carver::carved_figures slab_carver::lane::carved() const noexcept
{
  auto const word = users.load(std::memory_order_relaxed);
  return {.count = static_cast<std::size_t>((word & count_mask) >> count_shift),
          .bytes = static_cast<std::size_t>((word & units_mask) << unit_shift)};
}

slab_carver::slab_carver(ipc_memory_resource_impl& owner)
    : owner_(owner),
      lane_count_(checked_lanes(owner)),
      chooser_(lane_count_, owner.options().carving_lanes != auto_carving_lanes),
      asks_on_slow_path_(!owner.checks_every_call_),
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
  int previous = 0;
  cudaGetDevice(&previous);
  auto const device = owner.pool().device;
  if (previous != device) { cudaSetDevice(device); }
  if (cudaStreamCreateWithFlags(&release_stream_, cudaStreamNonBlocking) != cudaSuccess) {
    cudaGetLastError();
    release_stream_ = nullptr;  // trims give back in the legacy stream's order
  }
  if (previous != device) { cudaSetDevice(previous); }
}

void slab_carver::abandon() noexcept
{
  owner_.get_session().unwatch_reclaims(reclaim_watch_);
  if (keeper_.joinable()) {
    keeper_.request_stop();
    keeper_.join();
  }
  for (std::size_t i = 0; i < lane_count_; ++i) {
    auto& l = lanes_[i];
    std::lock_guard lock(l.pool_mutex);
    l.users.fetch_or(closed, std::memory_order_relaxed);
    static_cast<void>(l.pool.release());
  }
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
    for (std::size_t i = 0; i < lane_count_; ++i) { static_cast<void>(lanes_[i].pool.release()); }
    return;
  }
  // The session's other resources of this pool report on without this one.
  detail::impl_of(owner_.get_session()).reports().forget_reporter(this, owner_.pool().id);
  trim();
  if (release_stream_ != nullptr) {
    // Destroying a stream does not wait for it: the slabs' Free host
    // functions still run.
    cudaStreamDestroy(release_stream_);
  }
  carved_figures left;
  for (std::size_t i = 0; i < lane_count_; ++i) {
    auto& l = lanes_[i];
    if (l.pool == nullptr) { continue; }
    auto const c = l.carved();
    left.count += c.count;
    left.bytes += c.bytes;
    if (c.count != 0) { static_cast<void>(l.pool.release()); }
  }
  if (left.count != 0) {
    rmmd::detail::stderr_line(
        "rmmd: an ipc_memory_resource of pool '%s' was destroyed with %zu allocations "
        "(%zu bytes) still carved; its slabs stay leased until the session closes\n",
        owner_.pool().name.c_str(),
        left.count,
        left.bytes);
  }
}

slab_carver::carved_figures slab_carver::carved() const noexcept
{
  carved_figures sum;
  for (std::size_t i = 0; i < lane_count_; ++i) {
    auto const c = lanes_[i].carved();
    sum.count += c.count;
    sum.bytes += c.bytes;
  }
  return sum;
}

std::size_t slab_carver::slab_bytes() const noexcept
{
  std::size_t sum = 0;
  for (std::size_t i = 0; i < lane_count_; ++i) {
    sum += lanes_[i].slab_bytes.load(std::memory_order_relaxed);
  }
  return sum;
}

void slab_carver::open_pool(lane& l)
{
  std::lock_guard lock(l.pool_mutex);
  if ((l.users.load(std::memory_order_relaxed) & closed) == 0) { return; }  // another thread did
  if (l.pool == nullptr) {
    // The first slab is leased here; later ones as RMM's pool grows. The
    // first lane's pointers are those no other lane holds: it keeps no table.
    bool const first = &l == &lanes_[0];
    l.slots.store(0, std::memory_order_relaxed);  // every slot is free: its pool is gone
    l.pool = std::make_unique<rmm::mr::pool_memory_resource>(
        direct_upstream{&owner_,
                        &l.slab_bytes,
                        first ? nullptr : l.ranges.data(),
                        first ? nullptr : &l.slots,
                        lane::max_slabs},
        owner_.options().slab_bytes);
  }
  // Release: a carving call that sees the bit clear sees the pool.
  l.users.fetch_and(~closed, std::memory_order_release);
}

std::size_t slab_carver::lane_of(void const* ptr, std::size_t hint) const noexcept
{
  auto const p = reinterpret_cast<std::uintptr_t>(ptr);
  if (hint != 0 && lanes_[hint].holds(p)) { return hint; }
  for (std::size_t i = 1; i < lane_count_; ++i) {
    if (i != hint && lanes_[i].holds(p)) { return i; }
  }
  return 0;
}

void slab_carver::refuse_alignment(std::size_t bytes, std::size_t alignment) const
{
  throw rmmd::logic_error("rmmd: allocate " + std::to_string(bytes) + " bytes from pool '" +
                          owner_.pool().name + "': alignment " + std::to_string(alignment) +
                          " is larger than the 256 bytes CUDA pools guarantee");
}

void* slab_carver::allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
{
  if (alignment > max_alignment) [[unlikely]] { refuse_alignment(bytes, alignment); }
  try {
    // The thread carving alone (one lane, or before a second thread came)
    // pays a load and a compare to find its lane.
    auto const lane = chooser_.pick();
    if (lane == 0) [[likely]] { return carve(lanes_[0], stream, bytes, alignment); }
    try {
      return carve(lanes_[lane], stream, bytes, alignment);
    } catch (rmm::out_of_memory const&) {
      // The lane could not grow (no memory for a slab of its own, or its
      // table is full): what the first lane holds may serve, or its lease
      // says why not.
      if (failed_lease) { throw; }
      return carve(lanes_[0], stream, bytes, alignment);
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

inline void* slab_carver::carve(lane& l,
                                cuda::stream_ref stream,
                                std::size_t bytes,
                                std::size_t alignment)
{
  auto const mine = carving(bytes);
  for (;;) {
    // Counted before the pool is touched, so trim() cannot take it meanwhile.
    auto const before = l.users.fetch_add(mine, std::memory_order_acquire);
    if ((before & closed) == 0) [[likely]] {
      // More carved than the lane's slabs hold: the pool must lease a slab.
      if (asks_on_slow_path_ && ((before + mine) & units_mask) << unit_shift >
                                    l.slab_bytes.load(std::memory_order_relaxed)) [[unlikely]] {
        if (void* ptr = lease_if_capturing(l, mine, stream, bytes, alignment)) { return ptr; }
      }
      try {
        return l.pool->allocate(stream, bytes, alignment);
      } catch (...) {
        l.users.fetch_sub(mine, std::memory_order_release);
        throw;
      }
    }
    l.users.fetch_sub(mine, std::memory_order_release);
    // Opening the pool leases its first slab.
    if (asks_on_slow_path_ && capturing_graph(stream.get()) != nullptr) [[unlikely]] {
      return owner_.allocate_captured(bytes, alignment);
    }
    open_pool(l);
  }
}

void* slab_carver::lease_if_capturing(lane& l,
                                      std::uint64_t counted,
                                      cuda::stream_ref stream,
                                      std::size_t bytes,
                                      std::size_t alignment)
{
  if (capturing_graph(stream.get()) == nullptr) { return nullptr; }
  // RMM's pool would first make the capturing stream wait on the events of
  // blocks freed on other streams (which CUDA refuses in a capture, and
  // which invalidates it), then lease: a lease of its own instead.
  l.users.fetch_sub(counted, std::memory_order_release);
  return owner_.allocate_captured(bytes, alignment);
}

void slab_carver::deallocate(cuda::stream_ref stream,
                             void* ptr,
                             std::size_t bytes,
                             std::size_t alignment) noexcept
{
  // `ptr` is counted in its lane's word until the end of this call: the
  // lane's pool stays.
  auto& l = chooser_.single() ? lanes_[0] : lanes_[lane_of(ptr, chooser_.hint())];
  if (l.pool == nullptr) { return; }  // abandoned, or destroyed with this still carved
  if (stream.get() == cudaStreamPerThread) [[unlikely]] {
    l.per_thread_frees.store(true, std::memory_order_relaxed);
  }
  l.pool->deallocate(stream, ptr, bytes, alignment);
  l.users.fetch_sub(carving(bytes), std::memory_order_release);
}

std::size_t slab_carver::trim() noexcept
{
  return trim_lanes([](std::size_t) { return true; });
}

template <typename Pick>
std::size_t slab_carver::trim_lanes(Pick which) noexcept
{
  std::array<std::unique_ptr<rmm::mr::pool_memory_resource>, max_lanes> idle;
  bool any         = false;
  bool device_wide = false;
  for (std::size_t i = 0; i < lane_count_; ++i) {
    if (!which(i)) { continue; }
    auto& l = lanes_[i];
    std::lock_guard lock(l.pool_mutex);
    if (l.pool == nullptr) { continue; }
    // Only a count of zero closes: nothing carved, no allocate() under way;
    // those that come now find it closed and wait for this lock.
    std::uint64_t idle_users = 0;
    if (!l.users.compare_exchange_strong(idle_users, closed, std::memory_order_acquire)) {
      continue;
    }
    idle[i] = std::move(l.pool);
    any     = true;
    if (l.per_thread_frees.exchange(false, std::memory_order_relaxed)) { device_wide = true; }
  }
  if (!any) { return 0; }
  std::size_t bytes = 0;
  for (auto const& pool : idle) {
    if (pool) { bytes += pool->pool_size(); }
  }
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
  // Work queued on any stream may still use memory that was carved from
  // these slabs and freed in stream order. RMM's pool records an event on a
  // stream at each free into it, and waits for them all when it is
  // destroyed; the slabs it hands back meanwhile are parked, and given back
  // after that wait, in the order of this carver's own stream. Nothing waits
  // for the whole device (cudaDeviceSynchronize), which would invalidate
  // another thread's graph capture in global mode. Frees on
  // cudaStreamPerThread are the exception: RMM keeps their events per
  // thread, where the pool does not wait for them, so a lane that had one
  // waits for the device first.
  if (device_wide) {
    if (auto err = cudaDeviceSynchronize(); err != cudaSuccess) {
      cudaGetLastError();
      for (auto& pool : idle) { static_cast<void>(pool.release()); }
      if (cuda_is_going(err)) { return 0; }
      rmmd::detail::stderr_line(
          "rmmd: trimming pool '%s': cudaDeviceSynchronize: %s; keeping the slabs\n",
          owner_.pool().name.c_str(),
          cudaGetErrorName(err));
      return 0;
    }
  }
  std::vector<void*> parked;
  try {
    parked.reserve(64);
  } catch (std::bad_alloc const&) {
  }
  // Freeing an import (cudaFreeAsync), and maybe destroying RMM's events,
  // count as unsafe while another thread captures in global mode: in this
  // thread's default mode they fail (cudaErrorStreamCaptureUnsupported) and
  // invalidate that capture. In relaxed mode this thread's calls are not
  // held against other threads' captures; the slabs are no graph's memory,
  // and RMM's events were recorded outside captures.
  auto mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  parked_slabs = &parked;
  for (auto& pool : idle) {
    try {
      pool.reset();  // RMM waits for its streams' events, then frees its events
    } catch (std::exception const& e) {
      rmmd::detail::stderr_line(
          "rmmd: trimming pool '%s': %s\n", owner_.pool().name.c_str(), e.what());
      bytes = 0;
    }
  }
  parked_slabs = nullptr;
  cuda::stream_ref const order{release_stream_ != nullptr ? release_stream_ : cudaStreamLegacy};
  for (void* slab : parked) { owner_.unlease_slab(order, slab); }
  cudaThreadExchangeStreamCaptureMode(&mode);
  return bytes;
}

std::size_t slab_carver::reclaimable_bytes() const noexcept
{
  // RMM's pool gives back all of its slabs or none: a lane's slabs may be
  // asked back only when nothing is carved from it.
  std::size_t sum = 0;
  for (std::size_t i = 0; i < lane_count_; ++i) {
    if (lanes_[i].carved().count == 0) {
      sum += lanes_[i].slab_bytes.load(std::memory_order_relaxed);
    }
  }
  return sum;
}

carved_usage slab_carver::usage(carved_figures carved,
                                std::size_t slabs,
                                std::uint32_t generation) const noexcept
{
  // A carve is counted before its pool grows (see carve()): while a new
  // slab is on its way, what is carved may exceed the slabs read after it,
  // and the lanes are read again after `carved`: a lane whose last carving
  // was freed meanwhile may count as reclaimable while `carved` still holds
  // it. The daemon refuses a report with more carved than slabs, or more
  // reclaimable than the slabs not carved: both are capped here. Slabs of a
  // daemon other than `generation`'s are not that daemon's: left out (what
  // they carve may then be counted against its ones, capped).
  slabs -= std::min(slabs, owner_.slab_bytes_not_lent_by(generation));
  auto const carved_bytes = std::min(carved.bytes, slabs);
  return carved_usage{
      .pool_id          = owner_.pool().id,
      .bytes            = carved_bytes,
      .allocation_count = carved.count,
      .slab_bytes       = slabs,
      .reclaimable_bytes =
          carved.count == 0 ? slabs : std::min(slabs - carved_bytes, reclaimable_bytes())};
}

bool slab_carver::note_idle_lanes(keeper_state& state, clock::time_point now) noexcept
{
  bool holding = false;
  for (std::size_t i = 0; i < lane_count_; ++i) {
    auto& l = lanes_[i];
    {
      std::lock_guard pool_lock(l.pool_mutex);
      holding = holding || l.pool != nullptr;
    }
    if (l.carved().count != 0) { state.idle_since[i] = now; }
  }
  return holding;
}

bool slab_carver::report_if_due(keeper_state& state, bool holding, clock::time_point now) noexcept
{
  // The daemon the figures are counted for: read first, so that a slab a
  // later daemon lends meanwhile is left out rather than counted for this one.
  auto const generation = detail::impl_of(owner_.get_session()).channel().generation();
  auto const figures    = carved();
  auto const slabs      = slab_bytes();
  bool const changed    = figures.bytes != state.reported.bytes ||
                       figures.count != state.reported.count || slabs != state.reported_slabs;
  // While it holds slabs it reports every second, to hear of pressure.
  if (!changed && !(holding && now - state.last_report >= std::chrono::seconds(1))) {
    return false;
  }
  try {
    auto const trim_pools = detail::impl_of(owner_.get_session())
                                .reports()
                                .report_carved(this, usage(figures, slabs, generation), generation);
    state.reported       = figures;
    state.reported_slabs = slabs;
    state.last_report    = now;
    return std::find(trim_pools.begin(), trim_pools.end(), owner_.pool().id) != trim_pools.end();
  } catch (rmmd::session_error const&) {
    state.reporting = false;  // the daemon is gone; the next allocation says so
  } catch (std::exception const& e) {
    rmmd::detail::stderr_line("%s\n", e.what());  // "rmmd: report usage: ..."
    state.last_report = now;
  }
  return false;
}

void slab_carver::report_now(keeper_state& state, clock::time_point now) noexcept
{
  auto const generation =
      detail::impl_of(owner_.get_session()).channel().generation();  // first: see above
  auto const slabs   = slab_bytes();
  auto const figures = carved();
  try {
    static_cast<void>(detail::impl_of(owner_.get_session())
                          .reports()
                          .report_carved(this, usage(figures, slabs, generation), generation));
    state.reported       = figures;
    state.reported_slabs = slabs;
    state.last_report    = now;
  } catch (std::exception const&) {
    // The next tick reports again.
  }
}

void slab_carver::keep_once(keeper_state& state, bool asked) noexcept
{
  auto const now     = clock::now();
  bool const holding = note_idle_lanes(state, now);
  // Asked by the daemon (another session waits): give back first, report after.
  bool const pressed = asked || (state.reporting && report_if_due(state, holding, now));
  if (holding) {
    // Each lane nothing is carved from: at once when pressed, else once
    // idle for idle_trim (trim_lanes() skips a lane that carves by then).
    auto const idle_trim = owner_.options().idle_trim;
    static_cast<void>(trim_lanes(
        [&](std::size_t i) { return pressed || now - state.idle_since[i] >= idle_trim; }));
  }
  if (!state.reporting) { return; }
  // Asked: what is left (nothing, or slabs something is carved from), so
  // that the daemon stops waiting for this session. Trimmed: say so now
  // rather than at the next tick.
  if (asked || (holding && slab_bytes() != state.reported_slabs)) { report_now(state, now); }
}

void slab_carver::keep(std::stop_token stop) noexcept
{
  auto const tick = std::clamp<clock::duration>(owner_.options().idle_trim / 4,
                                                std::chrono::milliseconds(10),
                                                std::chrono::milliseconds(250));
  // Its CUDA calls (trim) are for the pool's device.
  cudaSetDevice(owner_.pool().device);
  keeper_state state;
  state.last_report = clock::now();
  state.idle_since.fill(clock::now());
  std::unique_lock lock(keeper_mutex_);
  while (!stop.stop_requested()) {
    keeper_wake_.wait_for(lock, stop, tick, [this] { return reclaim_asked_; });
    if (stop.stop_requested()) { break; }
    bool const asked = std::exchange(reclaim_asked_, false);
    // Not held while it works: the reclaim watch takes it to wake the keeper,
    // and runs on a thread (the session's reader, or a call's) that may hold
    // the session's watch list while this thread's report waits for it.
    lock.unlock();
    keep_once(state, asked);
    lock.lock();
  }
}

}  // namespace rmmd::detail
