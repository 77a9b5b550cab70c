#include "daemon/backends/cuda/cuda_pool_kind.hpp"

#include "common/gpu_identity.hpp"
#include "daemon/backends/cuda/cuda_backend.hpp"
#include "daemon/backends/cuda/fabric_probe.hpp"
#include "daemon/log.hpp"

#include <absl/strings/str_format.h>
#include <cuda_runtime_api.h>

#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace rmmd::backends::cuda {
namespace {

namespace fs = std::filesystem;

/// A CUDA pool backend; if its fabric export fails even though the probe
/// passed, says so and makes a posix-fd-only pool instead.
std::unique_ptr<cuda_backend> make_cuda_backend(cuda_pool_options options)
{
  try {
    return std::make_unique<cuda_backend>(options);
  } catch (std::exception const& e) {
    if (!options.fabric) { throw; }
    log::warn(
        "device %d: %s; serving its pool with posix-fd export only", options.device, e.what());
    options.fabric = false;
    return std::make_unique<cuda_backend>(options);
  }
}

/// Sets `p.device` from `p.gpu` (a UUID or PCI bus id), found among the
/// GPUs this process sees (its own CUDA_VISIBLE_DEVICES decides their
/// ordinals), and checks that the device exists. False after saying why.
bool find_device(config::pool_settings& p, int gpus)
{
  if (!p.gpu.empty()) {
    std::string seen;
    p.device = -1;
    for (int d = 0; d < gpus && p.device < 0; ++d) {
      auto id = gpu::identify(d);
      if (id && gpu::names(*id, p.gpu)) { p.device = d; }
      if (id) { seen += (seen.empty() ? "" : ", ") + id->uuid + " (" + id->pci_bus_id + ")"; }
    }
    if (p.device < 0) {
      log::error("pool '%s': no GPU %s among those CUDA shows this daemon: %s",
                 p.name,
                 p.gpu,
                 seen.empty() ? std::string("none") : seen);
      return false;
    }
  }
  if (p.device >= gpus) {
    log::error(
        "pool '%s': CUDA device %d does not exist (CUDA sees %d GPU(s); nvidia-smi "
        "lists them)",
        p.name,
        p.device,
        gpus);
    return false;
  }
  return true;
}

/// Whether the pool gets fabric handles, proven by a probe in a child
/// process; nullopt, after saying why, when the pool cannot be served as
/// configured. `fatal` says whether that stops the daemon.
std::optional<bool> prove_fabric(config::pool_settings const& p, bool& fatal, std::string& why)
{
  if (p.fabric == config::fabric_mode::off) { return false; }
  std::error_code ec;
  auto const self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) {
    log::error(
        "pool '%s': cannot find rmmd's own program to probe fabric handles "
        "(/proc/self/exe: %s)",
        p.name,
        ec.message());
    fatal = true;
    return std::nullopt;
  }
  auto support = probe_fabric(p.device, self);
  if (!support.usable && p.fabric == config::fabric_mode::required) {
    log::error(
        "pool '%s' is not served: it requires fabric handles, but %s", p.name, support.reason);
    why   = support.reason;  // the pool is not served: the caller says so to peers
    fatal = false;
    return std::nullopt;
  }
  if (!support.usable) {
    log::warn("pool '%s': no fabric handles, posix-fd only: %s", p.name, support.reason);
    why = support.reason;
  }
  return support.usable;
}

/// Adds a CUDA pool. False, after saying why, if it cannot be made; true
/// also when it is skipped because fabric handles are required and missing.
bool add_cuda_pool(core::daemon_core& core,
                   config::pool_settings const& settings,
                   pool_start const& start)
{
  auto p = settings;
  if (!find_device(p, start.gpus)) { return false; }
  bool fatal = false;
  std::string no_fabric_because;
  auto const proven = prove_fabric(p, fatal, no_fabric_because);
  if (!proven) {
    if (!fatal && start.unserved != nullptr) {
      start.unserved->push_back(
          absl::StrFormat("pool '%s' is not served: it requires fabric handles, but %s",
                          p.name,
                          no_fabric_because));
    }
    return !fatal;
  }
  bool fabric = *proven;
  try {
    std::size_t capacity = p.limit_bytes;
    if (capacity == 0) {
      std::size_t free = 0, total = 0;
      cudaSetDevice(p.device);
      if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
        throw std::runtime_error("cudaMemGetInfo failed");
      }
      capacity = free / 10 * 8;
    }
    if (p.release_threshold_bytes > capacity || p.initial_size_bytes > capacity) {
      log::error(
          "pool '%s': its release threshold (%d bytes) and initial size (%d bytes) must not "
          "exceed its limit of %d bytes",
          p.name,
          p.release_threshold_bytes,
          p.initial_size_bytes,
          capacity);
      return false;
    }
    cuda_pool_options options{.device            = p.device,
                              .capacity          = capacity,
                              .release_threshold = p.release_threshold_bytes,
                              .initial_size      = p.initial_size_bytes,
                              .fabric            = fabric,
                              .vmm_buffers       = start.vmm_buffers};
    // Every tenant's pool of this device allocates and frees on its streams.
    options.streams = std::make_shared<cuda_streams>(p.device);
    options.spares  = spare_memory::of_device(p.device, start.keep_released);
    // One pool made now proves the options (and the fabric export, which
    // may fail even though the probe passed); the tenants' pools are made
    // with what it proved.
    bool const proven_fabric = fabric;
    fabric                   = !make_cuda_backend(options)->fabric_handle().empty();
    options.fabric           = fabric;
    if (proven_fabric && !fabric) {
      no_fabric_because =
          "its fabric export failed at start although the probe passed (the log says why)";
    }
    std::vector<core::handle_type> types{core::handle_type::posix_fd};
    if (fabric) { types.push_back(core::handle_type::fabric); }
    auto const gpu = gpu::identify(p.device).value_or(gpu::identity{});
    // A pool per tenant (a uid's first session makes its own), all of them
    // together within `capacity`.
    core.pools().add_pool(
        core::pool_config{.name           = p.name,
                          .device         = p.device,
                          .gpu_uuid       = gpu.uuid,
                          .pci_bus_id     = gpu.pci_bus_id,
                          .handle_types   = types,
                          .limit_bytes    = capacity,
                          .max_alignment  = 256,
                          .fabric_problem = no_fabric_because},
        cuda_backend::kind_traits,
        capacity,
        [options](core::tenant_key const&) { return make_cuda_backend(options); });
    log::info("pool '%s': CUDA device %d (%s, %s), %s export, up to %d bytes",
              p.name,
              p.device,
              gpu.uuid,
              gpu.pci_bus_id,
              fabric ? "posix-fd and fabric" : "posix-fd",
              capacity);
    return true;
  } catch (std::exception const& e) {
    log::error("cannot create the CUDA pool '%s' on device %d: %s", p.name, p.device, e.what());
    return false;
  }
}

}  // namespace

pool_kind_entry cuda_pool_kind() noexcept
{
  return {.config    = config::pool_kind::cuda,
          .traits    = cuda_backend::kind_traits,
          .needs_gpu = true,
          .add       = add_cuda_pool};
}

}  // namespace rmmd::backends::cuda
