#include "client/detail/pool_mappings.hpp"

#include "client/detail/daemon_message_checks.hpp"
#include "client/detail/existing_context.hpp"
#include "client/detail/process_exit.hpp"
#include "common/gpu_identity.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace rmmd::detail {

namespace {

pool_info describe(v1::PoolDescription const& p)
{
  return pool_info{
      .id             = p.id(),
      .name           = p.name(),
      .device         = p.device(),
      .backend        = p.backend() == v1::BACKEND_CUDA ? backend_kind::cuda : backend_kind::host,
      .capacity_bytes = p.capacity_bytes(),
      .has_fabric_handle = !p.fabric_handle().empty(),
      .max_alignment     = p.max_alignment(),
      .pinnable          = p.pinnable(),
      .gpu_uuid          = p.gpu_uuid(),
      .pci_bus_id        = p.pci_bus_id()};
}

}  // namespace

pool_mappings::pool_mappings(session_welcome&& welcome, bool import_by_fabric)
    : import_by_fabric_(import_by_fabric)
{
  auto const& w = welcome.welcome;
  auto& first   = generations_[0];
  first.fds     = std::move(welcome.pool_fds);
  first.fabric_handles.resize(static_cast<std::size_t>(w.pools_size()));
  for (auto const& p : w.pools()) {
    pools_.push_back(describe(p));
    first.pools.emplace_back(pools_.back());
    if (p.id() < first.fabric_handles.size()) { first.fabric_handles[p.id()] = p.fabric_handle(); }
  }
}

void pool_mappings::adopt(std::uint32_t generation,
                          session_welcome&& welcome,
                          std::vector<std::int64_t> const& daemon_pool)
{
  auto const& mine = pools();  // devices mapped (the new pools' are the same GPUs)
  generation_pools g;
  g.pools.resize(mine.size());
  g.fds.assign(mine.size(), -1);
  g.fabric_handles.resize(mine.size());
  auto const& w = welcome.welcome;
  for (std::size_t ours = 0; ours < mine.size() && ours < daemon_pool.size(); ++ours) {
    auto const theirs = daemon_pool[ours];
    if (theirs < 0 || theirs >= w.pools_size()) { continue; }
    auto const& p          = w.pools(static_cast<int>(theirs));
    auto info              = describe(p);
    info.id                = static_cast<std::uint32_t>(ours);
    info.device            = mine[ours].device;
    g.pools[ours]          = std::move(info);
    g.fabric_handles[ours] = p.fabric_handle();
    auto& fd               = welcome.pool_fds[static_cast<std::size_t>(theirs)];
    g.fds[ours]            = std::exchange(fd, -1);
  }
  for (int fd : welcome.pool_fds) {  // pools of the new daemon's alone
    if (fd >= 0) { ::close(fd); }
  }
  std::lock_guard lock(map_mutex_);
  if (auto old = generations_.find(generation); old != generations_.end()) {
    // 2^15 reconnects later: the number comes round; its fds go, its
    // mappings stay until the session ends.
    for (int fd : old->second.fds) {
      if (fd >= 0) { ::close(fd); }
    }
  }
  generations_[generation] = std::move(g);
  latest_.store(generation, std::memory_order_release);
}

std::optional<pool_info> pool_mappings::described(std::uint32_t pool_id, std::uint32_t generation)
{
  std::lock_guard lock(map_mutex_);
  auto it = generations_.find(generation);
  if (it == generations_.end() || pool_id >= it->second.pools.size()) { return std::nullopt; }
  return it->second.pools[pool_id];
}

std::pair<pool_mappings::generation_pools const*, pool_info> pool_mappings::pool_locked(
    std::uint32_t pool_id, std::uint32_t generation)
{
  auto it = generations_.find(generation);
  if (it == generations_.end() || pool_id >= it->second.pools.size() ||
      !it->second.pools[pool_id]) {
    throw rmmd::logic_error("rmmd: pool " + std::to_string(pool_id) +
                            " is not served by the daemon this session reconnected to");
  }
  return {&it->second, *it->second.pools[pool_id]};
}

pool_mappings::~pool_mappings()
{
  // Imports first: an imported pool must go before the fd it came from. No
  // CUDA call while the process exits: the process's end releases them.
  if (!process_is_exiting()) {
    for (auto& [id, pool] : cuda_pools_) { cudaMemPoolDestroy(pool); }
    // In a context the process has (none made for it): without one, the
    // registrations went with the last.
    if (existing_context context; context) {
      for (auto id : pinned_) { cudaHostUnregister(mappings_.at(id).first); }
    }
  }
  for (auto& [id, m] : mappings_) { ::munmap(m.first, m.second); }
  for (auto& [generation, g] : generations_) {
    for (int fd : g.fds) {
      if (fd >= 0) { ::close(fd); }
    }
  }
}

std::vector<pool_info> const& pool_mappings::pools() noexcept
{
  std::call_once(devices_mapped_, [this] {
    // CUDA_VISIBLE_DEVICES renumbers GPUs per process: the daemon's ordinal
    // names another GPU here, or none. Its UUID names the same one everywhere.
    bool const by_uuid = std::any_of(pools_.begin(), pools_.end(), [](pool_info const& p) {
      return p.backend == backend_kind::cuda && !p.gpu_uuid.empty();
    });
    if (!by_uuid) { return; }  // host pools only, or a daemon that sends no UUIDs
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      count = 0;
    }
    std::vector<std::string> uuids;
    for (int d = 0; d < count; ++d) {
      auto id = gpu::identify(d);
      uuids.push_back(id ? id->uuid : std::string());
    }
    for (auto& p : pools_) {
      if (p.backend != backend_kind::cuda) { continue; }
      auto it  = std::find(uuids.begin(), uuids.end(), p.gpu_uuid);
      p.device = it == uuids.end() ? -1 : static_cast<int>(it - uuids.begin());
    }
  });
  return pools_;
}

std::byte* pool_mappings::host_pool_base(std::uint32_t pool_id, std::uint32_t generation)
{
  std::lock_guard lock(map_mutex_);
  auto const k = key(pool_id, generation);
  if (auto it = mappings_.find(k); it != mappings_.end()) { return it->second.first; }
  if (pool_id >= pools_.size() || pools_[pool_id].backend != backend_kind::host) {
    throw rmmd::logic_error("rmmd: pool " + std::to_string(pool_id) + " is not a host pool");
  }
  auto const [g, pool] = pool_locked(pool_id, generation);
  int const fd         = g->fds[pool_id];
  if (pool.backend != backend_kind::host || fd < 0) {
    throw rmmd::logic_error("rmmd: pool " + std::to_string(pool_id) + " is not a host pool");
  }
  // The daemon aligns offsets; map the pool at an address aligned as strongly,
  // so that an offset aligned to A is an address aligned to A. Reserve room
  // for the alignment, map the pool at the aligned spot, give back the rest.
  auto const size  = pool.capacity_bytes;
  auto const align = std::max<std::size_t>(pool.max_alignment, 4096);
  if (auto why = check_host_pool_fd(fd, size)) {
    throw rmm::bad_alloc("rmmd: mapping host pool '" + pool.name + "' failed: " + *why);
  }
  auto fail = [&](char const* what) {
    throw rmm::bad_alloc("rmmd: mapping host pool '" + pool.name + "' failed (" + what +
                         "): " + std::strerror(errno));
  };
  void* room = ::mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (room == MAP_FAILED) { fail("reserve"); }
  auto const start = reinterpret_cast<std::uintptr_t>(room);
  auto const at    = (start + align - 1) / align * align;
  void* p          = ::mmap(
      reinterpret_cast<void*>(at), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    ::munmap(room, size + align);
    fail("map");
  }
  if (at > start) { ::munmap(room, at - start); }
  if (auto tail = start + size + align - (at + size); tail > 0) {
    ::munmap(reinterpret_cast<void*>(at + size), tail);
  }
  mappings_.emplace(k, std::pair{static_cast<std::byte*>(p), size});
  return static_cast<std::byte*>(p);
}

std::string not_pinnable(std::string const& pool_name)
{
  return "host pool '" + pool_name +
         "' is not pinnable: the daemon gives its free pages back to the kernel, which a "
         "page-locked mapping cannot follow; start rmmd with --host-pool-pinned=on";
}

cudaError_t register_host(void* data, std::size_t bytes, bool read_only) noexcept
{
  unsigned const flags = cudaHostRegisterPortable | cudaHostRegisterMapped |
                         (read_only ? cudaHostRegisterReadOnly : 0U);
  auto const err = cudaHostRegister(data, bytes, flags);
  if (err != cudaSuccess) { cudaGetLastError(); }
  return err;
}

std::byte* pool_mappings::pinned_host_pool_base(std::uint32_t pool_id, std::uint32_t generation)
{
  auto* base = host_pool_base(pool_id, generation);
  std::lock_guard lock(map_mutex_);
  auto const k = key(pool_id, generation);
  if (pinned_.contains(k)) { return base; }
  auto const pool = pool_locked(pool_id, generation).second;
  if (!pool.pinnable) {
    throw rmmd::logic_error("rmmd: " + not_pinnable(pool.name) +
                            ", or use rmmd::host_memory_resource");
  }
  // Once per session: about 0.1 s per GiB (measured on an H100), and it
  // commits the whole pool's RAM in this process's page tables.
  auto err = register_host(base, pool.capacity_bytes, false);
  if (err != cudaSuccess) {
    throw rmm::bad_alloc("rmmd: page-locking host pool '" + pool.name + "' (" +
                         std::to_string(pool.capacity_bytes) +
                         " bytes, cudaHostRegister) failed: " + cudaGetErrorName(err) +
                         "; check RLIMIT_MEMLOCK (ulimit -l)");
  }
  // Kernels get the host address itself; that needs a GPU that can use host
  // pointers of registered memory directly (every GPU with unified addressing).
  void* device_ptr = nullptr;
  err              = cudaHostGetDevicePointer(&device_ptr, base, 0);
  if (err != cudaSuccess || device_ptr != base) {
    cudaGetLastError();
    cudaHostUnregister(base);
    throw rmmd::logic_error("rmmd: this GPU cannot use the host pool's addresses directly (" +
                            std::string(cudaGetErrorName(err)) +
                            "); use rmmd::host_memory_resource and copy");
  }
  pinned_.insert(k);
  return base;
}

cudaMemPool_t pool_mappings::cuda_pool(std::uint32_t pool_id, std::uint32_t generation)
{
  std::lock_guard lock(map_mutex_);
  auto const k = key(pool_id, generation);
  if (auto it = cuda_pools_.find(k); it != cuda_pools_.end()) { return it->second; }
  if (pool_id >= pools_.size() || pools_[pool_id].backend != backend_kind::cuda) {
    throw rmmd::logic_error("rmmd: pool " + std::to_string(pool_id) + " is not a CUDA pool");
  }
  auto const [g, described] = pool_locked(pool_id, generation);
  cudaMemPool_t pool{};
  cudaError_t err{};
  if (import_by_fabric_) {
    auto const& handle = g->fabric_handles[pool_id];
    if (handle.size() != sizeof(cudaMemFabricHandle_t)) {
      throw rmmd::logic_error("rmmd: pool '" + described.name +
                              "' has no fabric handle (the daemon found no IMEX channel, or runs "
                              "with --fabric=off; see its start-up log)");
    }
    cudaMemFabricHandle_t fabric{};
    std::memcpy(&fabric, handle.data(), sizeof(fabric));
    err = cudaMemPoolImportFromShareableHandle(&pool, &fabric, cudaMemHandleTypeFabric, 0);
  } else {
    if (g->fds[pool_id] < 0) {
      throw rmmd::logic_error("rmmd: pool '" + described.name + "' came without a pool fd");
    }
    err = cudaMemPoolImportFromShareableHandle(
        &pool,
        reinterpret_cast<void*>(static_cast<std::uintptr_t>(g->fds[pool_id])),
        cudaMemHandleTypePosixFileDescriptor,
        0);
  }
  if (err != cudaSuccess) {
    throw rmm::bad_alloc("rmmd: importing CUDA pool '" + described.name +
                         "' failed: " + cudaGetErrorName(err));
  }
  cuda_pools_.emplace(k, pool);
  return pool;
}

}  // namespace rmmd::detail
