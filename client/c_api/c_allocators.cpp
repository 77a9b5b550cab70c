// librmmd_c's allocators: the entry points PyTorch's CUDAPluggableAllocator
// loads (rmmd_torch_*), over one process-wide session, with a device
// resource per GPU (rmmd_torch_malloc) and a stable resource per GPU
// (rmmd_torch_stable_malloc, what rmmd.memory_saver's MemPools load).

#include "client/c_api/c_internal.hpp"

#include "client/detail/process_exit.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

using rmmd::c_api::fail;
using rmmd::c_api::guarded;
using rmmd::c_api::null_argument;

namespace {

/// The process-wide session and per-device resources of the PyTorch entry
/// points. Made at the first allocation and never destroyed: PyTorch may free
/// tensors while the interpreter exits, after any static would have gone,
/// and the process's end closes the session (the daemon then reclaims it
/// all), so nothing needs to run, or print, at exit.
struct torch_allocator {
  static constexpr int max_devices = 64;

  std::mutex mutex;  // guards all but `resources`' and `stables`' loads
  bool started{false};
  bool configured{false};  // rmmd_torch_configure() was called: it wins over the environment
  std::optional<std::string> runtime_dir;
  rmmd_allocation_mode mode{RMMD_MODE_SLAB};
  std::optional<rmmd::session> session;
  std::array<std::atomic<rmmd_resource_s*>, max_devices> resources{};
  std::array<std::atomic<rmmd_stable_resource_s*>, max_devices> stables{};

  static torch_allocator& get()
  {
    static auto* const instance = new torch_allocator;
    return *instance;
  }

  static void check_device(int device)
  {
    if (device < 0 || device >= max_devices) {
      throw rmmd::logic_error("rmmd: device " + std::to_string(device) + " is not a CUDA device");
    }
  }

  /// The process-wide session, made at the first call. REQUIRES: mutex held.
  rmmd::session& session_locked()
  {
    if (session) { return *session; }
    rmmd::session::options o;
    if (runtime_dir) { o.runtime_dir = *runtime_dir; }
    if (!configured) {
      if (char const* m = std::getenv("RMMD_TORCH_MODE")) {
        std::string_view text(m);
        if (text == "direct") {
          mode = RMMD_MODE_DIRECT;
        } else if (text != "slab" && !text.empty()) {
          throw rmmd::logic_error("rmmd: RMMD_TORCH_MODE is '" + std::string(text) +
                                  "'; use slab (the default) or direct");
        }
      }
    }
    o.client_name = "torch";
    session.emplace(std::move(o));
    started = true;
    return *session;
  }

  rmmd_stable_resource_s& stable(int device)
  {
    check_device(device);
    if (auto* r = stables[device].load(std::memory_order_acquire)) { return *r; }
    std::lock_guard lock(mutex);
    if (auto* r = stables[device].load()) { return *r; }
    auto* r = new rmmd_stable_resource_s{rmmd::stable_memory_resource(session_locked(), device)};
    stables[device].store(r, std::memory_order_release);
    return *r;
  }

  rmmd_resource_s& resource(int device)
  {
    check_device(device);
    if (auto* r = resources[device].load(std::memory_order_acquire)) { return *r; }
    std::lock_guard lock(mutex);
    if (auto* r = resources[device].load()) { return *r; }
    auto& s = session_locked();
    rmmd::ipc_resource_options ro;
    ro.mode =
        mode == RMMD_MODE_DIRECT ? rmmd::allocation_mode::direct : rmmd::allocation_mode::slab;
    // Graph-safe: PyTorch captures graphs (torch.cuda.graph), its capture
    // stream's allocations would make RMM's pool wait on events of other
    // streams (which CUDA refuses in a capture), and the check's ~30 ns is
    // nothing next to a tensor allocation's own cost in PyTorch.
    ro.capture = rmmd::capture_checks::every_call;
    auto* r = new rmmd_resource_s{.mr = rmmd::ipc_memory_resource(s, device, ro), .device = device};
    resources[device].store(r, std::memory_order_release);
    return *r;
  }
};

/// The PyTorch entry points' allocation: the status, and the pointer in *ptr (written only
/// when it succeeds: note_allocation() does not throw).
rmmd_status torch_allocate(std::size_t size, int device, void* stream, void** ptr) noexcept
{
  return guarded([&] {
    auto& r = torch_allocator::get().resource(device);
    *ptr    = std::get<rmmd::ipc_memory_resource>(r.mr).allocate(
        cuda::stream_ref{static_cast<cudaStream_t>(stream)}, size, 256);
    if (*ptr != nullptr) { rmmd::c_api::note_allocation(r, size); }
  });
}

}  // namespace

extern "C" {

void* rmmd_torch_malloc(size_t size, int device, void* stream)
{
  void* ptr = nullptr;
  return torch_allocate(size, device, stream, &ptr) == RMMD_SUCCESS ? ptr : nullptr;
}

rmmd_status rmmd_torch_allocate(size_t size, int device, void* stream, void** ptr)
{
  if (ptr == nullptr) { return null_argument("ptr"); }
  return torch_allocate(size, device, stream, ptr);  // writes *ptr only on success
}

void* rmmd_torch_malloc_or_raise(size_t size, int device, void* stream)
{
  void* ptr = nullptr;
  if (torch_allocate(size, device, stream, &ptr) != RMMD_SUCCESS) {
    throw std::runtime_error(rmmd_last_error_message());
  }
  return ptr;
}

void rmmd_torch_free(void* ptr, size_t size, int device, void* stream)
{
  if (ptr == nullptr || rmmd::detail::process_is_exiting()) { return; }
  static_cast<void>(guarded([&] {
    auto& r = torch_allocator::get().resource(device);
    std::get<rmmd::ipc_memory_resource>(r.mr).deallocate(
        cuda::stream_ref{static_cast<cudaStream_t>(stream)}, ptr, size, 256);
    rmmd::c_api::note_deallocation(r, size);
  }));
}

rmmd_status rmmd_torch_configure(char const* runtime_dir, rmmd_allocation_mode mode)
{
  if (mode != RMMD_MODE_SLAB && mode != RMMD_MODE_DIRECT) {
    return fail(RMMD_ERROR_INVALID_ARGUMENT,
                "rmmd: mode is neither RMMD_MODE_SLAB nor RMMD_MODE_DIRECT");
  }
  auto& t = torch_allocator::get();
  std::lock_guard lock(t.mutex);
  if (t.started) {
    return fail(RMMD_ERROR_FAILED_PRECONDITION,
                "rmmd: torch allocator: configure before the first allocation; it has begun");
  }
  return guarded([&] {
    t.runtime_dir = runtime_dir == nullptr ? std::nullopt : std::optional<std::string>(runtime_dir);
    t.mode        = mode;
    t.configured  = true;
  });
}

void* rmmd_torch_stable_malloc(size_t size, int device, void* /*stream: ready on every stream*/)
{
  void* ptr = nullptr;
  auto const status =
      guarded([&] { ptr = torch_allocator::get().stable(device).mr.allocate_sync(size, 256); });
  return status == RMMD_SUCCESS ? ptr : nullptr;
}

void rmmd_torch_stable_free(void* ptr, size_t size, int device, void* stream)
{
  if (ptr == nullptr || rmmd::detail::process_is_exiting()) { return; }
  if (device < 0 || device >= torch_allocator::max_devices) { return; }
  auto* r = torch_allocator::get().stables[device].load(std::memory_order_acquire);
  if (r == nullptr) { return; }  // not one of ours: nothing to free
  r->mr.deallocate(cuda::stream_ref{static_cast<cudaStream_t>(stream)}, ptr, size, 256);
}

rmmd_status rmmd_torch_stable_resource(int device, rmmd_stable_resource_t* resource)
{
  if (resource == nullptr) { return null_argument("resource"); }
  return guarded(
      [&] { *resource = new rmmd_stable_resource_s{torch_allocator::get().stable(device).mr}; });
}

rmmd_status rmmd_torch_stable_devices(uint64_t* devices)
{
  if (devices == nullptr) { return null_argument("devices"); }
  auto const& t      = torch_allocator::get();
  std::uint64_t mask = 0;
  for (int d = 0; d < torch_allocator::max_devices; ++d) {
    if (t.stables[d].load(std::memory_order_acquire) != nullptr) { mask |= std::uint64_t{1} << d; }
  }
  *devices = mask;
  return RMMD_SUCCESS;
}

rmmd_status rmmd_torch_get_stats(int device, rmmd_resource_stats* stats)
{
  if (stats == nullptr) { return null_argument("stats"); }
  if (device < 0 || device >= torch_allocator::max_devices) {
    return fail(RMMD_ERROR_INVALID_ARGUMENT,
                "rmmd: device " + std::to_string(device) + " is not a CUDA device");
  }
  auto* r = torch_allocator::get().resources[device].load(std::memory_order_acquire);
  if (r == nullptr) {
    return fail(
        RMMD_ERROR_NOT_FOUND,
        "rmmd: the torch allocator has made no allocation on device " + std::to_string(device));
  }
  return rmmd_resource_get_stats(r, stats);
}

}  // extern "C"
