#include "daemon/backends/host/host_pool_kind.hpp"

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/log.hpp"

#include <exception>
#include <memory>

namespace rmmd::backends::host {
namespace {

/// Adds a host pool; pinnable by default where the daemon serves GPUs.
bool add_host_pool(core::daemon_core& core, config::pool_settings const& p, pool_start const& start)
{
  // Clients may pin a pinnable pool (pinned_host_memory_resource), which
  // rules out punching holes in it.
  bool const pinnable = p.pinnable.value_or(start.gpus > 0);
  try {
    // Each tenant's memfd is as large as the pool (its pages cost nothing
    // until written); the core keeps all of them together within it.
    host_backend const probe(p.name, p.capacity_bytes, pinnable);
    core.pools().add_pool(
        core::pool_config{.name         = p.name,
                          .device       = -1,
                          .handle_types = {core::handle_type::host_offset},
                          .pinnable     = pinnable},
        host_backend::kind_traits,
        probe.capacity(),
        [name = p.name, bytes = p.capacity_bytes, pinnable](core::tenant_key const& t) {
          return std::make_unique<host_backend>(name, bytes, pinnable, t.text());
        });
    log::info("pool '%s': shared host memory, %d bytes%s",
              p.name,
              p.capacity_bytes,
              pinnable ? ", pinnable by clients (freed pages stay committed)" : "");
    return true;
  } catch (std::exception const& e) {
    log::error(
        "cannot create the host pool '%s' of %d bytes: %s", p.name, p.capacity_bytes, e.what());
    return false;
  }
}

}  // namespace

pool_kind_entry host_pool_kind() noexcept
{
  return {.config    = config::pool_kind::host,
          .traits    = host_backend::kind_traits,
          .needs_gpu = false,
          .add       = add_host_pool};
}

}  // namespace rmmd::backends::host
