#include "client/detail/buffer_views.hpp"

#include "client/detail/daemon_message_checks.hpp"
#include "client/detail/device_scope.hpp"
#include "client/detail/existing_context.hpp"
#include "client/detail/pool_mappings.hpp"
#include "client/detail/process_exit.hpp"
#include "client/detail/session_channel.hpp"
#include "common/fd_passing.hpp"
#include "common/vmm.hpp"

#include <unistd.h>

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <string>
#include <tuple>
#include <vector>

namespace rmmd::detail {
namespace {

// The choices a refused page-lock leaves, named for C++ and Python callers
// alike (the C ABI's names follow C++'s).
constexpr char const* open_unpinned = "pinning::off (Python: pinned=False)";
constexpr char const* open_automatic_or_unpinned =
    "pinning::automatic or off (Python: pinned=None or False)";

std::string in_quotes(std::string_view name)
{
  return "'" + std::string(name) + "'";
}

/// register_host(), as whether it worked.
bool page_lock(void* data, std::size_t bytes, bool read_only) noexcept
{
  return register_host(data, bytes, read_only) == cudaSuccess;
}

/// Undoes page_lock() in a context the process has; where it has none any
/// more, the registration went with the last one (and no call makes one).
void unpin(void* data) noexcept
{
  existing_context context;
  if (context && cudaHostUnregister(data) != cudaSuccess) { cudaGetLastError(); }
}

}  // namespace

void* buffer_views::attach(v1::BufferGrant const& grant,
                           view_mode mode,
                           bool holds_lease,
                           pinning pin)
{
  auto const& pools = pools_.unmapped();
  std::vector<pool_shape> shapes;
  for (auto const& p : pools) {
    shapes.push_back({.host_pool = p.backend == backend_kind::host, .capacity = p.capacity_bytes});
  }
  if (auto checked = check_buffer_grant(grant, shapes, 0); !checked.ok()) {
    throw_status(checked, "open buffer " + in_quotes(grant.name()));
  }
  auto const& pool      = pools[grant.pool_id()];
  bool const allocation = pool.backend == backend_kind::cuda && grant.has_vmm();
  bool const host_memfd = pool.backend == backend_kind::host && grant.has_host_memfd();
  // Pool pointers and places in a host pool's mapping: read-write only,
  // one view whatever the mode.
  if (!allocation && !host_memfd) { mode = view_mode::read_write; }
  bool const read_only =
      mode == view_mode::read_only || (mode == view_mode::standby && !holds_lease);
  std::lock_guard lock(buffers_mutex_);
  // A standby's view is its own (one standby per session and buffer).
  if (auto it = buffers_.find({grant.buffer_id(), mode});
      it != buffers_.end() && mode != view_mode::standby) {
    if (pin == pinning::required && pool.backend == backend_kind::host) {
      pin_view(it->second, grant, pool);
    }
    ++it->second.refs;
    return it->second.data;
  }
  if (allocation) { return attach_allocation(grant, pool, mode, read_only); }
  if (host_memfd) { return attach_host_memfd(grant, pool, mode, read_only, pin); }
  auto v = pool.backend == backend_kind::host
               ? attach_host(grant, pool, pin)
               : view{.data = attach_pool_pointer(grant, pool), .pool_id = grant.pool_id()};
  v.refs = 1;
  return buffers_.emplace(std::pair{grant.buffer_id(), view_mode::read_write}, v)
      .first->second.data;
}

bool buffer_views::pinned(std::uint64_t id, view_mode mode)
{
  std::lock_guard lock(buffers_mutex_);
  auto it = buffers_.find({id, mode});
  // Memory that has one view whatever the mode keeps it as read_write's.
  if (it == buffers_.end()) { it = buffers_.find({id, view_mode::read_write}); }
  return it != buffers_.end() && it->second.pinned;
}

buffer_views::view buffer_views::attach_host(v1::BufferGrant const& grant,
                                             pool_info const& pool,
                                             pinning pin)
{
  // The mapping of the daemon that granted it (a reconnect may have come
  // since); page-locked, where it is, as a whole and in place.
  auto const generation = generation_of(grant.buffer_id());
  view v{.data    = pools_.host_pool_base(pool.id, generation) + grant.host().offset(),
         .pool_id = grant.pool_id()};
  if (pin == pinning::required) {
    pin_view(v, grant, pool);
  } else if (pin == pinning::automatic && pool.pinnable) {
    if (existing_context context; context) {
      try {
        (void)pools_.pinned_host_pool_base(pool.id, generation);
        v.pinned = true;
      } catch (std::exception const&) {
        // Not page-locked (RLIMIT_MEMLOCK; a GPU that cannot use the
        // pool's addresses directly): the plain mapping serves all the
        // same, as in a process without a GPU.
      }
    }
  }
  return v;
}

void* buffer_views::attach_host_memfd(v1::BufferGrant const& grant,
                                      pool_info const& pool,
                                      view_mode mode,
                                      bool read_only,
                                      pinning pin)
{
  // REQUIRES: buffers_mutex_ held (by attach).
  auto const bytes = grant.host_memfd().mapping_bytes();
  int const fd     = buffer_fd(grant.buffer_id());
  int const prot   = read_only ? PROT_READ : PROT_READ | PROT_WRITE;
  void* data       = ::mmap(nullptr, bytes, prot, MAP_SHARED, fd, 0);
  auto const error = errno;
  ::close(fd);  // the mapping keeps the memfd
  if (data == MAP_FAILED) {
    throw rmm::bad_alloc("rmmd: mapping host buffer " + in_quotes(grant.name()) + " (" +
                         std::to_string(bytes) + " bytes): mmap: " + std::strerror(error));
  }
  view v{.data         = data,
         .read_only    = read_only,
         .pool_id      = grant.pool_id(),
         .refs         = 1,
         .mapped_bytes = bytes,
         .host_mapping = true};
  if (pin == pinning::required) {
    try {
      pin_view(v, grant, pool);
    } catch (...) {
      ::munmap(data, bytes);
      throw;
    }
  } else if (pin == pinning::automatic && pool.pinnable) {
    // Page-locked, so that kernels and copies use it directly, where the
    // process has a context to do it in (none is made for it); where it
    // fails (RLIMIT_MEMLOCK, a device that cannot map read-only) the plain
    // mapping serves all the same.
    if (existing_context context; context) { v.pinned = page_lock(data, bytes, read_only); }
  }
  buffers_.emplace(std::pair{grant.buffer_id(), mode}, v);
  return data;
}

void buffer_views::pin_view(view& v, v1::BufferGrant const& grant, pool_info const& pool)
{
  if (v.pinned) { return; }
  auto const what = "page-lock host buffer " + in_quotes(grant.name());
  if (!pool.pinnable) {
    throw rmmd::logic_error("rmmd: " + what + ": " + not_pinnable(pool.name) +
                            ", or open it with " + open_unpinned);
  }
  // The runtime makes the current device's primary context where the
  // process has none: asked for.
  int devices      = 0;
  auto const count = cudaGetDeviceCount(&devices);
  if (count != cudaSuccess || devices == 0) {
    cudaGetLastError();
    throw rmm::bad_alloc("rmmd: " + what + ": this process sees no GPU (" +
                         cudaGetErrorName(count != cudaSuccess ? count : cudaErrorNoDevice) +
                         "); open it with " + open_automatic_or_unpinned);
  }
  existing_context context;
  if (!v.host_mapping) {
    // A place in the pool's mapping: the pool is page-locked as a whole.
    (void)pools_.pinned_host_pool_base(pool.id, generation_of(grant.buffer_id()));
    v.pinned = true;
    return;
  }
  if (auto err = register_host(v.data, v.mapped_bytes, v.read_only); err != cudaSuccess) {
    // A read-only open on a GPU that cannot page-lock read-only says so;
    // anything else is most likely the locked-memory limit.
    int read_only_support = 1;
    int device            = 0;
    if (v.read_only && (cudaGetDevice(&device) != cudaSuccess ||
                        cudaDeviceGetAttribute(&read_only_support,
                                               cudaDevAttrHostRegisterReadOnlySupported,
                                               device) != cudaSuccess)) {
      cudaGetLastError();
      read_only_support = 1;
    }
    auto const why = v.read_only && read_only_support == 0
                         ? "device " + std::to_string(device) +
                               " cannot page-lock memory read-only: open it writable, or with " +
                               open_automatic_or_unpinned
                         : std::string("check RLIMIT_MEMLOCK (ulimit -l)");
    throw rmm::bad_alloc("rmmd: " + what + " (" + std::to_string(v.mapped_bytes) +
                         " bytes, cudaHostRegister) failed: " + cudaGetErrorName(err) + "; " + why);
  }
  v.pinned = true;
}

void buffer_views::unmap_host(view const& v) noexcept
{
  if (!v.host_mapping) { return; }
  if (v.pinned) { unpin(v.data); }
  ::munmap(v.data, v.mapped_bytes);
}

void* buffer_views::attach_pool_pointer(v1::BufferGrant const& grant, pool_info const& pool)
{
  if (pools_.pools()[pool.id].device < 0) {
    throw rmmd::logic_error("rmmd: buffer " + in_quotes(grant.name()) + " is on GPU " +
                            pool.gpu_uuid + ", which this process cannot see");
  }
  auto const& bytes = grant.cuda().export_data();
  cudaMemPoolPtrExportData export_data{};
  if (bytes.size() != sizeof(export_data)) {
    throw rmm::bad_alloc("rmmd: the daemon's export data for buffer " + in_quotes(grant.name()) +
                         " has " + std::to_string(bytes.size()) + " bytes");
  }
  std::memcpy(&export_data, bytes.data(), sizeof(export_data));
  void* data = nullptr;
  if (auto err = cudaMemPoolImportPointer(
          &data, pools_.cuda_pool(pool.id, generation_of(grant.buffer_id())), &export_data);
      err != cudaSuccess) {
    cudaGetLastError();
    throw rmm::bad_alloc("rmmd: importing buffer " + in_quotes(grant.name()) + " of pool '" +
                         pool.name + "' failed: " + cudaGetErrorName(err));
  }
  return data;
}

void* buffer_views::attach_remote(v1::BufferGrant const& grant, bool read_only, int device)
{
  if (auto checked = check_peer_buffer_grant(grant); !checked.ok()) {
    throw_status(checked, "open buffer '" + grant.peer() + ":" + grant.name() + "'");
  }
  auto const mode = read_only ? view_mode::read_only : view_mode::read_write;
  std::lock_guard lock(buffers_mutex_);
  if (auto it = buffers_.find({grant.buffer_id(), mode}); it != buffers_.end()) {
    ++it->second.refs;
    return it->second.data;
  }
  auto* data = map_allocation(grant, device, mode, read_only, true);
  keep_peer_anchor(grant, device);
  return data;
}

void buffer_views::keep_peer_anchor(v1::BufferGrant const& grant, int device) noexcept
{
  // REQUIRES: buffers_mutex_ held (by attach_remote).
  if (!grant.has_peer_anchor()) { return; }
  auto const& anchor = grant.peer_anchor();
  decltype(anchors_)::iterator it;
  try {
    bool made          = false;
    std::tie(it, made) = anchors_.try_emplace({anchor.gpu_uuid(), device});
    if (!made) { return; }
  } catch (std::bad_alloc const&) {
    return;  // no anchor: the next open pays the first mapping
  }
  auto const& api  = gpu::vmm();
  auto const bytes = anchor.allocation_bytes();
  // One granule or a few: a daemon's anchor is never large.
  if (!api || anchor.fabric_handle().size() != sizeof(CUmemFabricHandle) || bytes == 0 ||
      bytes > (std::uint64_t{1} << 30)) {
    return;
  }
  device_scope on(device);
  if (on.error() != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  CUmemFabricHandle fabric{};
  std::memcpy(&fabric, anchor.fabric_handle().data(), sizeof(fabric));
  CUmemGenericAllocationHandle handle{};
  if (api->import_handle(&handle, &fabric, CU_MEM_HANDLE_TYPE_FABRIC) != CUDA_SUCCESS) { return; }
  CUdeviceptr address{};
  if (api->address_reserve(&address, bytes, 0, 0, 0) != CUDA_SUCCESS) {
    api->mem_release(handle);
    return;
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id   = device;
  access.flags         = CU_MEM_ACCESS_FLAGS_PROT_READ;
  if (api->map(address, bytes, 0, handle, 0) != CUDA_SUCCESS) {
    api->address_free(address, bytes);
    api->mem_release(handle);
    return;
  }
  if (api->set_access(address, bytes, &access, 1) != CUDA_SUCCESS) {
    api->unmap(address, bytes);
    api->address_free(address, bytes);
    api->mem_release(handle);
    return;
  }
  it->second = anchor_mapping{.vmm_handle = handle, .address = address, .bytes = bytes};
  watch_process_exit();  // CUDA has started: the anchors go quietly at exit
}

std::vector<buffer_views::peer_anchor> buffer_views::peer_anchors()
{
  std::lock_guard lock(buffers_mutex_);
  std::vector<peer_anchor> out;
  for (auto const& [key, m] : anchors_) {
    if (m.vmm_handle != 0) { out.push_back({.gpu_uuid = key.first, .device = key.second}); }
  }
  return out;
}

buffer_views::~buffer_views()
{
  // No CUDA call while the process exits: its end releases them.
  auto const& api = gpu::vmm();
  if (!api || process_is_exiting()) { return; }
  for (auto const& [key, m] : anchors_) {
    if (m.vmm_handle == 0) { continue; }
    api->unmap(m.address, m.bytes);
    api->address_free(m.address, m.bytes);
    api->mem_release(static_cast<CUmemGenericAllocationHandle>(m.vmm_handle));
  }
}

void* buffer_views::attach_allocation(v1::BufferGrant const& grant,
                                      pool_info const& pool,
                                      view_mode mode,
                                      bool read_only)
{
  // REQUIRES: buffers_mutex_ held (by attach).
  auto const device = pools_.pools()[pool.id].device;
  if (device < 0) {
    throw rmmd::logic_error("rmmd: buffer '" + grant.name() + "' is on GPU " + pool.gpu_uuid +
                            ", which this process cannot see");
  }
  return map_allocation(grant, device, mode, read_only, import_by_fabric_);
}

void* buffer_views::map_allocation(
    v1::BufferGrant const& grant, int device, view_mode mode, bool read_only, bool by_fabric)
{
  // REQUIRES: buffers_mutex_ held (by attach or attach_remote).
  std::string why;
  auto const& api = gpu::vmm(&why);
  if (!api) { throw rmm::bad_alloc("rmmd: open buffer '" + grant.name() + "': " + why); }
  device_scope on(device);
  if (auto err = on.error(); err != cudaSuccess) {
    throw rmm::bad_alloc(std::string("rmmd: cudaSetDevice: ") + cudaGetErrorName(err));
  }
  auto const& v = grant.vmm();
  auto failed   = [&](char const* what, CUresult r) {
    return rmm::bad_alloc("rmmd: mapping buffer '" + grant.name() + "' (" +
                          std::to_string(v.allocation_bytes()) + " bytes): " + what + ": " +
                          api->name(r));
  };
  CUmemGenericAllocationHandle handle{};
  if (by_fabric && !v.fabric_handle().empty()) {
    CUmemFabricHandle fabric{};
    std::memcpy(&fabric, v.fabric_handle().data(), sizeof(fabric));
    if (auto r = api->import_handle(&handle, &fabric, CU_MEM_HANDLE_TYPE_FABRIC);
        r != CUDA_SUCCESS) {
      throw failed("cuMemImportFromShareableHandle (fabric)", r);
    }
  } else {
    if (!v.has_fd()) {
      throw rmmd::logic_error("rmmd: buffer '" + grant.name() +
                              "' comes by fabric handle only; set session::options::"
                              "import_by_fabric");
    }
    int fd = buffer_fd(grant.buffer_id());
    auto r = api->import_handle(&handle,
                                reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    ::close(fd);  // the import holds the allocation now
    if (r != CUDA_SUCCESS) { throw failed("cuMemImportFromShareableHandle (posix fd)", r); }
  }
  auto const bytes  = v.allocation_bytes();
  auto const prop   = gpu::device_allocation(device, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  std::size_t grain = 0;
  if (auto r = api->granularity(&grain, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      r != CUDA_SUCCESS || grain == 0) {
    api->mem_release(handle);
    throw failed("cuMemGetAllocationGranularity", r);
  }
  CUdeviceptr address{};
  if (auto r = api->address_reserve(&address, bytes, grain, 0, 0); r != CUDA_SUCCESS) {
    api->mem_release(handle);
    throw failed("cuMemAddressReserve", r);
  }
  if (auto r = api->map(address, bytes, 0, handle, 0); r != CUDA_SUCCESS) {
    api->address_free(address, bytes);
    api->mem_release(handle);
    throw failed("cuMemMap", r);
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  // Read-only in hardware for a reader: its writes fault in its own
  // context, and no other holder's mapping changes.
  access.flags = read_only ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (auto r = api->set_access(address, bytes, &access, 1); r != CUDA_SUCCESS) {
    api->unmap(address, bytes);
    api->address_free(address, bytes);
    api->mem_release(handle);
    throw failed(read_only ? "cuMemSetAccess (read-only)" : "cuMemSetAccess", r);
  }
  auto* data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(address));
  buffers_.emplace(std::pair{grant.buffer_id(), mode},
                   view{.data         = data,
                        .read_only    = read_only,
                        .pool_id      = grant.pool_id(),
                        .refs         = 1,
                        .vmm_handle   = handle,
                        .mapped_bytes = bytes,
                        .device       = device});
  return data;
}

std::optional<buffer_views::view> buffer_views::detach(std::uint64_t id, view_mode mode) noexcept
{
  std::lock_guard lock(buffers_mutex_);
  auto it = buffers_.find({id, mode});
  // A read or standby open of memory that cannot be mapped read-only has
  // the one read-write view.
  if (it == buffers_.end() && mode != view_mode::read_write) {
    it = buffers_.find({id, view_mode::read_write});
  }
  if (it == buffers_.end()) { return std::nullopt; }
  if (--it->second.refs > 0) { return std::nullopt; }
  auto out = it->second;
  buffers_.erase(it);
  return out;
}

void buffer_views::upgrade(std::uint64_t id)
{
  std::lock_guard lock(buffers_mutex_);
  auto it = buffers_.find({id, view_mode::standby});
  if (it == buffers_.end() || !it->second.read_only) { return; }
  auto& v = it->second;
  if (v.vmm_handle != 0) {
    std::string why;
    auto const& api = gpu::vmm(&why);
    if (!api) {
      throw rmm::bad_alloc("rmmd: make buffer " + std::to_string(id) + " writable: " + why);
    }
    device_scope on(v.device);  // a driver call needs the device's context current
    if (auto err = on.error(); err != cudaSuccess) {
      throw rmm::bad_alloc("rmmd: make buffer " + std::to_string(id) +
                           " writable: cudaSetDevice: " + cudaGetErrorName(err));
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id   = v.device;
    access.flags         = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    // The same range, the same mapping: only its access changes.
    if (auto r = api->set_access(static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(v.data)),
                                 v.mapped_bytes,
                                 &access,
                                 1);
        r != CUDA_SUCCESS) {
      throw rmm::bad_alloc("rmmd: make buffer " + std::to_string(id) +
                           " writable: cuMemSetAccess (read-write): " + api->name(r));
    }
  } else if (v.host_mapping) {
    // Page-locked read-only, the GPU could not write it: registered again
    // read-write after the mprotect (where that fails, a plain mapping), in
    // the context the process has.
    // Where the registration cannot be undone it stays as it is (read-only
    // for the GPU) and is undone at the unmap.
    existing_context context;
    bool const unpinned = v.pinned && context && cudaHostUnregister(v.data) == cudaSuccess;
    if (v.pinned && !unpinned) { cudaGetLastError(); }
    if (::mprotect(v.data, v.mapped_bytes, PROT_READ | PROT_WRITE) != 0) {
      auto const error = errno;
      if (unpinned) { v.pinned = page_lock(v.data, v.mapped_bytes, true); }
      throw rmm::bad_alloc("rmmd: make buffer " + std::to_string(id) +
                           " writable: mprotect: " + std::strerror(error));
    }
    if (unpinned) { v.pinned = page_lock(v.data, v.mapped_bytes, false); }
  }
  v.read_only = false;
}

void buffer_views::unmap_allocation(view const& v) noexcept
{
  auto const& api = gpu::vmm();
  if (!api) { return; }
  auto const address = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(v.data));
  api->unmap(address, v.mapped_bytes);
  api->address_free(address, v.mapped_bytes);
  api->mem_release(static_cast<CUmemGenericAllocationHandle>(v.vmm_handle));
}

int buffer_views::buffer_fd(std::uint64_t id)
{
  if (!channel_.daemon_takes_calls()) {
    throw rmmd::logic_error(
        "rmmd: this daemon takes no calls on the session socket, the only way an fd travels; "
        "import CUDA buffers by fabric handle (session::options::import_by_fabric)");
  }
  v1::SessionCall c;
  c.mutable_buffer_fd()->set_buffer_id(id);
  v1::SessionReply reply;
  std::vector<int> fds;
  auto status = channel_.call(c, &reply, &fds);
  if (status.ok() && (fds.size() != 1 || reply.buffer_fd().fd_index() != 0)) {
    status = {grpc::StatusCode::INTERNAL,
              "the daemon's reply brought " + std::to_string(fds.size()) + " fds, not one"};
  }
  if (!status.ok()) {
    fd_passing::close_fds(fds, fds.size());  // whatever came with a refusal is not ours
    throw_status(status, "fd of buffer " + std::to_string(id));
  }
  return fds.front();
}

}  // namespace rmmd::detail
