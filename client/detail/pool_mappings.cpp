#include "client/detail/pool_mappings.hpp"

#include "client/detail/daemon_message_checks.hpp"
#include "client/detail/process_exit.hpp"
#include "common/gpu_identity.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace rmmd::detail {

pool_mappings::pool_mappings(session_welcome&& welcome, bool import_by_fabric)
    : import_by_fabric_(import_by_fabric), pool_fds_(std::move(welcome.pool_fds))
{
  auto const& w = welcome.welcome;
  fabric_handles_.resize(static_cast<std::size_t>(w.pools_size()));
  for (auto const& p : w.pools()) {
    pools_.push_back(pool_info{
        .id             = p.id(),
        .name           = p.name(),
        .device         = p.device(),
        .backend        = p.backend() == v1::BACKEND_CUDA ? backend_kind::cuda : backend_kind::host,
        .capacity_bytes = p.capacity_bytes(),
        .has_fabric_handle = !p.fabric_handle().empty(),
        .max_alignment     = p.max_alignment(),
        .pinnable          = p.pinnable(),
        .gpu_uuid          = p.gpu_uuid(),
        .pci_bus_id        = p.pci_bus_id()});
    if (p.id() < fabric_handles_.size()) { fabric_handles_[p.id()] = p.fabric_handle(); }
  }
}

pool_mappings::~pool_mappings()
{
  // Imports first: an imported pool must go before the fd it came from. No
  // CUDA call while the process exits: the process's end releases them.
  if (!process_is_exiting()) {
    for (auto& [id, pool] : cuda_pools_) { cudaMemPoolDestroy(pool); }
    for (auto id : pinned_) { cudaHostUnregister(mappings_.at(id).first); }
  }
  for (auto& [id, m] : mappings_) { ::munmap(m.first, m.second); }
  for (int fd : pool_fds_) {
    if (fd >= 0) { ::close(fd); }
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

std::byte* pool_mappings::host_pool_base(std::uint32_t pool_id)
{
  std::lock_guard lock(map_mutex_);
  if (auto it = mappings_.find(pool_id); it != mappings_.end()) { return it->second.first; }
  if (pool_id >= pools_.size() || pools_[pool_id].backend != backend_kind::host ||
      pool_fds_[pool_id] < 0) {
    throw rmmd::logic_error("rmmd: pool " + std::to_string(pool_id) + " is not a host pool");
  }
  // The daemon aligns offsets; map the pool at an address aligned as strongly,
  // so that an offset aligned to A is an address aligned to A. Reserve room
  // for the alignment, map the pool at the aligned spot, give back the rest.
  auto const size  = pools_[pool_id].capacity_bytes;
  auto const align = std::max<std::size_t>(pools_[pool_id].max_alignment, 4096);
  if (auto why = check_host_pool_fd(pool_fds_[pool_id], size)) {
    throw rmm::bad_alloc("rmmd: mapping host pool '" + pools_[pool_id].name + "' failed: " + *why);
  }
  auto fail = [&](char const* what) {
    throw rmm::bad_alloc("rmmd: mapping host pool '" + pools_[pool_id].name + "' failed (" + what +
                         "): " + std::strerror(errno));
  };
  void* room = ::mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (room == MAP_FAILED) { fail("reserve"); }
  auto const start = reinterpret_cast<std::uintptr_t>(room);
  auto const at    = (start + align - 1) / align * align;
  void* p          = ::mmap(reinterpret_cast<void*>(at),
                   size,
                   PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED,
                   pool_fds_[pool_id],
                   0);
  if (p == MAP_FAILED) {
    ::munmap(room, size + align);
    fail("map");
  }
  if (at > start) { ::munmap(room, at - start); }
  if (auto tail = start + size + align - (at + size); tail > 0) {
    ::munmap(reinterpret_cast<void*>(at + size), tail);
  }
  mappings_.emplace(pool_id, std::pair{static_cast<std::byte*>(p), size});
  return static_cast<std::byte*>(p);
}

std::byte* pool_mappings::pinned_host_pool_base(std::uint32_t pool_id)
{
  auto* base = host_pool_base(pool_id);
  std::lock_guard lock(map_mutex_);
  if (pinned_.contains(pool_id)) { return base; }
  auto const& pool = pools_[pool_id];
  if (!pool.pinnable) {
    throw rmmd::logic_error("rmmd: host pool '" + pool.name +
                            "' is not pinnable: the daemon gives its free pages back to the "
                            "kernel, which a pinned mapping cannot follow; start rmmd with "
                            "--host-pool-pinned=on, or use rmmd::host_memory_resource");
  }
  // Once per session: about 0.1 s per GiB (measured on an H100), and it
  // commits the whole pool's RAM in this process's page tables.
  auto err = cudaHostRegister(
      base, pool.capacity_bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (err != cudaSuccess) {
    cudaGetLastError();
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
  pinned_.insert(pool_id);
  return base;
}

cudaMemPool_t pool_mappings::cuda_pool(std::uint32_t pool_id)
{
  std::lock_guard lock(map_mutex_);
  if (auto it = cuda_pools_.find(pool_id); it != cuda_pools_.end()) { return it->second; }
  if (pool_id >= pools_.size() || pools_[pool_id].backend != backend_kind::cuda) {
    throw rmmd::logic_error("rmmd: pool " + std::to_string(pool_id) + " is not a CUDA pool");
  }
  cudaMemPool_t pool{};
  cudaError_t err{};
  if (import_by_fabric_) {
    auto const& handle = fabric_handles_[pool_id];
    if (handle.size() != sizeof(cudaMemFabricHandle_t)) {
      throw rmmd::logic_error("rmmd: pool '" + pools_[pool_id].name +
                              "' has no fabric handle (the daemon found no IMEX channel, or runs "
                              "with --fabric=off; see its start-up log)");
    }
    cudaMemFabricHandle_t fabric{};
    std::memcpy(&fabric, handle.data(), sizeof(fabric));
    err = cudaMemPoolImportFromShareableHandle(&pool, &fabric, cudaMemHandleTypeFabric, 0);
  } else {
    if (pool_fds_[pool_id] < 0) {
      throw rmmd::logic_error("rmmd: pool '" + pools_[pool_id].name + "' came without a pool fd");
    }
    err = cudaMemPoolImportFromShareableHandle(
        &pool,
        reinterpret_cast<void*>(static_cast<std::uintptr_t>(pool_fds_[pool_id])),
        cudaMemHandleTypePosixFileDescriptor,
        0);
  }
  if (err != cudaSuccess) {
    throw rmm::bad_alloc("rmmd: importing CUDA pool '" + pools_[pool_id].name +
                         "' failed: " + cudaGetErrorName(err));
  }
  cuda_pools_.emplace(pool_id, pool);
  return pool;
}

}  // namespace rmmd::detail
