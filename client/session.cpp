// rmmd::session: the public face of a session; the work is done by the
// parts of detail::session_impl (client/detail/session_impl.hpp).

#include <rmmd/session.hpp>

#include "client/detail/session_impl.hpp"
#include "common/gpu_identity.hpp"
#include "common/runtime_dir.hpp"

#include <cstdlib>
#include <string>

namespace rmmd {

std::filesystem::path session::default_runtime_dir()
{
  return runtime::resolve_runtime_dir();
}

session::session() : session(options{}) {}

session::session(options opts) : impl_(std::make_shared<detail::session_impl>(std::move(opts))) {}

std::uint64_t session::id() const noexcept
{
  return impl_->channel().session_id();
}

std::uint32_t session::reconnects() const noexcept
{
  return impl_->channel().reconnects();
}

std::vector<pool_info> const& session::pools() const noexcept
{
  return impl_->mappings().pools();
}

pool_info const& session::pool(std::string_view name) const
{
  std::string known;
  for (auto const& p : impl_->mappings().pools()) {
    if (p.name == name) { return p; }
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw rmmd::logic_error("rmmd: no pool named '" + std::string(name) +
                          "'; this daemon serves: " + known);
}

pool_info const& session::device_pool(int device) const
{
  std::string known;
  for (auto const& p : impl_->mappings().pools()) {
    if (p.backend != backend_kind::cuda) { continue; }
    if (p.device == device) { return p; }
    known += (known.empty() ? "" : ", ") + p.name + " on " +
             (p.gpu_uuid.empty() ? "device " + std::to_string(p.device) : p.gpu_uuid) +
             (p.device < 0 ? " (not visible to this process)" : "");
  }
  std::string mine = "CUDA device " + std::to_string(device);
  if (auto id = gpu::identify(device)) { mine += " (" + id->uuid + ", " + id->pci_bus_id + ")"; }
  char const* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  throw rmmd::logic_error(
      "rmmd: the daemon serves no pool on this process's " + mine +
      "; it serves: " + (known.empty() ? "no GPU pool (no GPU, or --backend=host)" : known) +
      (visible != nullptr ? "; this process has CUDA_VISIBLE_DEVICES=" + std::string(visible)
                          : std::string()));
}

cudaMemPool_t session::cuda_pool(std::uint32_t pool_id) const
{
  return impl_->mappings().cuda_pool(pool_id);
}

pool_info const& session::host_pool() const
{
  for (auto const& p : impl_->mappings().pools()) {
    if (p.backend == backend_kind::host) { return p; }
  }
  throw rmmd::logic_error("rmmd: this daemon serves no host pool");
}

lease session::allocate(std::uint32_t pool_id, std::size_t bytes, std::size_t alignment) const
{
  return impl_->lease_memory(pool_id, bytes, alignment, false).granted;
}

void session::free(std::uint64_t allocation_id) const
{
  v1::FreeRequest request;
  request.set_allocation_id(allocation_id);
  auto status = impl_->free(request);
  if (!status.ok()) {
    detail::throw_status(status, "free allocation " + std::to_string(allocation_id));
  }
}

void session::free_without_reply(std::uint64_t allocation_id) const noexcept
{
  detail::session_impl::free_when_reached(*impl_->releases(), allocation_id);
}

std::vector<std::uint32_t> session::report_usage(std::vector<carved_usage> const& usage) const
{
  return impl_->reports().send(usage);
}

std::uint64_t session::watch_reclaims(std::uint32_t pool_id,
                                      std::function<void(std::uint32_t)> on_request) const
{
  return impl_->reports().watch(pool_id, std::move(on_request));
}

void session::unwatch_reclaims(std::uint64_t watch_id) const noexcept
{
  impl_->reports().unwatch(watch_id);
}

std::byte* session::host_pool_base(std::uint32_t pool_id) const
{
  return impl_->mappings().host_pool_base(pool_id);
}

std::byte* session::pinned_host_pool_base(std::uint32_t pool_id) const
{
  return impl_->mappings().pinned_host_pool_base(pool_id);
}

}  // namespace rmmd
