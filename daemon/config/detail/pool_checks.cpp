#include "daemon/config/detail/checks.hpp"
#include "daemon/config/detail/handle_type_checks.hpp"
#include "daemon/config/detail/value_formats.hpp"

#include <absl/strings/str_format.h>

#include <map>
#include <string>

namespace rmmd::config::detail {
namespace {

void check_host_pool(
    checked_file& f, v1::Pool const& p, node const& n, std::string const& label, pool_settings& out)
{
  out.backend    = pool_kind::host;
  out.device     = -1;
  auto cuda_only = [&](std::string_view field) {
    f.error(n,
            field,
            field == "handle_types" ? 0 : -1,
            "%s: %s applies to CUDA pools only; a host pool is sized by capacity_bytes",
            label,
            field);
  };
  if (p.has_device()) { cuda_only("device"); }
  if (p.has_gpu()) { cuda_only("gpu"); }
  if (p.handle_types_size() > 0) { cuda_only("handle_types"); }
  if (p.initial_size_bytes() != 0) { cuda_only("initial_size_bytes"); }
  if (p.release_threshold_bytes() != 0) { cuda_only("release_threshold_bytes"); }
  if (p.has_limit_bytes()) { cuda_only("limit_bytes"); }
  if (p.has_pinnable()) { out.pinnable = p.pinnable(); }
  out.capacity_bytes = p.has_capacity_bytes() ? p.capacity_bytes() : default_host_pool_bytes;
  if (out.capacity_bytes == 0) {
    f.error(n,
            "capacity_bytes",
            -1,
            "%s: capacity_bytes is 0; give the pool a size, e.g. 1073741824 (1 GiB)",
            label);
  }
}

/// limit_bytes, and the initial size and release threshold within it.
void check_cuda_sizes(
    checked_file& f, v1::Pool const& p, node const& n, std::string const& label, pool_settings& out)
{
  out.initial_size_bytes      = p.initial_size_bytes();
  out.release_threshold_bytes = p.release_threshold_bytes();
  if (p.has_limit_bytes()) {
    out.limit_bytes = p.limit_bytes();
    if (out.limit_bytes == 0) {
      f.error(n,
              "limit_bytes",
              -1,
              "%s: limit_bytes is 0; give the most bytes the pool may lend, or leave it out for "
              "80%% of the GPU's free memory",
              label);
    } else {
      if (out.release_threshold_bytes > out.limit_bytes) {
        f.error(n,
                "release_threshold_bytes",
                -1,
                "%s: release_threshold_bytes (%d) is larger than limit_bytes (%d); lower the "
                "threshold or raise the limit",
                label,
                out.release_threshold_bytes,
                out.limit_bytes);
      }
      if (out.initial_size_bytes > out.limit_bytes) {
        f.error(n,
                "initial_size_bytes",
                -1,
                "%s: initial_size_bytes (%d) is larger than limit_bytes (%d); lower the initial "
                "size or raise the limit",
                label,
                out.initial_size_bytes,
                out.limit_bytes);
      }
    }
  }
}

void check_cuda_pool(
    checked_file& f, v1::Pool const& p, node const& n, std::string const& label, pool_settings& out)
{
  out.backend = pool_kind::cuda;
  out.device  = p.has_device() ? p.device() : 0;
  if (out.device < 0) {
    f.error(n,
            "device",
            -1,
            "%s: device %d is negative; give a CUDA device ordinal",
            label,
            out.device);
  }
  if (p.has_gpu()) {
    out.gpu = p.gpu();
    if (p.has_device()) {
      f.error(n,
              "gpu",
              -1,
              "%s: both device and gpu name the GPU; keep gpu (the same in every process)",
              label);
    } else if (!is_gpu_selector(out.gpu)) {
      f.error(n,
              "gpu",
              -1,
              "%s: gpu \"%s\" is neither a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, "
              "as nvidia-smi -L prints it) nor a PCI bus id (0000:3b:00.0)",
              label,
              out.gpu);
    }
  }
  if (p.has_capacity_bytes()) {
    f.error(n,
            "capacity_bytes",
            -1,
            "%s: capacity_bytes applies to host pools only; a CUDA pool is bounded by limit_bytes",
            label);
  }
  if (p.has_pinnable()) {
    f.error(n,
            "pinnable",
            -1,
            "%s: pinnable applies to host pools only (CUDA pool memory is device memory)",
            label);
  }
  out.fabric = checked_handle_types(f, p, n, label).value_or(fabric_mode::automatic);
  check_cuda_sizes(f, p, n, label, out);
}

}  // namespace

void check_pools(checked_file& f, daemon_settings& s)
{
  if (f.config().pools_size() == 0) { return; }  // the built-in pool set stays
  s.pools.clear();
  s.cuda_pool_per_gpu.reset();            // unless the file asks for it (check_per_gpu_pools)
  std::map<std::string, int> first_line;  // name -> line of its first definition
  for (int i = 0; i < f.config().pools_size(); ++i) {
    auto const& p = f.config().pools(i);
    auto const n  = f.nested(f.root(), "pools", i);
    auto label    = p.name().empty() ? absl::StrFormat("pools[%d]", i)
                                     : absl::StrFormat("pool \"%s\"", p.name());
    pool_settings out;
    out.line = n.line;
    out.name = p.name();
    if (p.name().empty()) {
      f.error(n, "name", -1, "%s has no name; give it one, e.g. name: \"gpu0\"", label);
    } else if (!valid_pool_name(p.name())) {
      f.error(n,
              "name",
              -1,
              "pool name \"%s\" may hold only letters, digits, '.', '_' and '-' (at most 64)",
              p.name());
    } else if (auto [it, fresh] = first_line.emplace(p.name(), n.line); !fresh) {
      f.error(n,
              "name",
              -1,
              "pool name \"%s\" is already used by the pool at line %d; pool names must be unique",
              p.name(),
              it->second);
    }
    switch (p.backend()) {
      case v1::Pool::HOST:
        check_host_pool(f, p, n, label, out);
        break;
      case v1::Pool::CUDA:
        check_cuda_pool(f, p, n, label, out);
        break;
      default:
        f.error(n,
                "backend",
                -1,
                "%s has no backend; add `backend: HOST` (shared host memory) or `backend: CUDA`",
                label);
    }
    s.pools.push_back(std::move(out));
  }
}

}  // namespace rmmd::config::detail
