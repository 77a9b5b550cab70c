#include "daemon/config/settings.hpp"

#include "common/runtime_dir.hpp"
#include "common/system_user.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_replace.h>

#include <unistd.h>

#include <cstdlib>
#include <string_view>

namespace rmmd::config {

std::string host_name()
{
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) { return "localhost"; }
  return name;
}

core::access_policy default_access()
{
  core::access_policy policy;
  policy.uids.push_back(::geteuid());
  // root, as for trim and delete: `sudo rmmctl stats` works out of the box.
  if (::geteuid() != 0) { policy.uids.push_back(0); }
  if (auto gid = common::find_group("rmmd")) { policy.gids.push_back(*gid); }
  return policy;
}

daemon_settings default_settings()
{
  daemon_settings s;
  s.access            = default_access();
  s.peering.node_name = host_name();
  s.pools.push_back(pool_settings{.name           = "host",
                                  .backend        = pool_kind::host,
                                  .device         = -1,
                                  .capacity_bytes = default_host_pool_bytes});
  return s;
}

std::filesystem::path effective_state_file(daemon_settings const& settings)
{
  if (!settings.state_file.empty()) { return settings.state_file; }
  constexpr char const* file = "buffers.state";
  if (char const* dirs = std::getenv("STATE_DIRECTORY"); dirs != nullptr && *dirs == '/') {
    std::string_view first(dirs);
    first = first.substr(0, first.find(':'));
    return std::filesystem::path(first) / file;
  }
  return effective_runtime_dir(settings) / file;
}

std::filesystem::path effective_runtime_dir(daemon_settings const& settings)
{
  return runtime::resolve_runtime_dir(settings.runtime_dir);
}

std::string per_uid_above_total(std::string_view what, std::size_t per_uid, std::size_t total)
{
  return absl::StrFormat(
      "admission.max_%s_per_uid (%d) is larger than admission.max_%s_total (%d): one uid could "
      "take every slot; lower the per-uid limit or raise the total",
      what,
      per_uid,
      what,
      total);
}

std::string mode_text(mode_t mode)
{
  return absl::StrFormat("%04o", static_cast<unsigned>(mode));
}

std::string_view level_name(log::level level)
{
  switch (level) {
    case log::level::error:
      return "error";
    case log::level::warning:
      return "warning";
    case log::level::info:
      return "info";
    case log::level::debug:
      return "debug";
  }
  return "info";
}

namespace {

std::string bytes_or_none(std::size_t bytes)
{
  return bytes == 0 ? std::string("no limit") : absl::StrFormat("%d bytes", bytes);
}

std::string pool_line(pool_settings const& p)
{
  if (p.backend == pool_kind::host) {
    return absl::StrFormat("  pool %s: host memory, %d bytes", p.name, p.capacity_bytes);
  }
  char const* handles = p.fabric == fabric_mode::off        ? "posix-fd"
                        : p.fabric == fabric_mode::required ? "posix-fd and fabric (required)"
                                                            : "posix-fd, fabric where it works";
  return absl::StrFormat(
      "  pool %s: CUDA device %d, %s, limit %s, release threshold %d bytes, initial %d bytes",
      p.name,
      p.device,
      handles,
      p.limit_bytes == 0 ? std::string("80% of free memory")
                         : absl::StrFormat("%d bytes", p.limit_bytes),
      p.release_threshold_bytes,
      p.initial_size_bytes);
}

std::string per_gpu_lines(per_gpu_pools const& g)
{
  pool_settings shared{.name                    = g.name_prefix + "N",
                       .backend                 = pool_kind::cuda,
                       .device                  = -1,
                       .fabric                  = g.fabric,
                       .initial_size_bytes      = g.initial_size_bytes,
                       .release_threshold_bytes = g.release_threshold_bytes,
                       .limit_bytes             = g.limit_bytes};
  std::string out = absl::StrCat(pool_line(shared), " (N: each GPU's ordinal)\n");
  absl::StrReplaceAll({{"CUDA device -1", "every GPU"}}, &out);
  for (auto const& o : g.overrides) {
    auto gpu = o.device >= 0 ? absl::StrCat("GPU ", o.device) : absl::StrCat("GPU ", o.gpu);
    if (o.skip) {
      absl::StrAppendFormat(&out, "  %s: no pool\n", gpu);
      continue;
    }
    std::vector<std::string> what;
    if (!o.name.empty()) { what.push_back(absl::StrCat("named ", o.name)); }
    if (o.fabric) { what.push_back(absl::StrCat("handle types set")); }
    if (o.limit_bytes) { what.push_back(absl::StrFormat("limit %d bytes", *o.limit_bytes)); }
    if (o.release_threshold_bytes) {
      what.push_back(absl::StrFormat("release threshold %d bytes", *o.release_threshold_bytes));
    }
    if (o.initial_size_bytes) {
      what.push_back(absl::StrFormat("initial %d bytes", *o.initial_size_bytes));
    }
    absl::StrAppendFormat(&out, "  %s: %s\n", gpu, absl::StrJoin(what, ", "));
  }
  return out;
}

}  // namespace

std::string summary(daemon_settings const& s)
{
  std::string out;
  absl::StrAppendFormat(&out,
                        "runtime directory %s (mode %s), sockets mode %s, group %s\n",
                        effective_runtime_dir(s).string(),
                        mode_text(s.runtime_dir_mode),
                        mode_text(s.socket_mode),
                        s.socket_group
                            ? absl::StrFormat("%s (gid %d)", s.socket_group_name, *s.socket_group)
                            : std::string("the daemon's own"));
  absl::StrAppendFormat(
      &out,
      "allowed: uids [%s], gids [%s]%s\n",
      absl::StrJoin(s.access.uids, ", "),
      absl::StrJoin(s.access.gids, ", "),
      s.access_is_default ? " (default: the daemon's user, root and group rmmd)" : "");
  absl::StrAppendFormat(&out,
                        "pools: %d%s\n",
                        s.pools.size(),
                        s.cuda_pool_per_gpu ? absl::StrFormat(", then one CUDA pool per GPU (%s0, "
                                                              "%s1, ...)",
                                                              s.cuda_pool_per_gpu->name_prefix,
                                                              s.cuda_pool_per_gpu->name_prefix)
                                            : std::string());
  for (auto const& p : s.pools) { absl::StrAppend(&out, pool_line(p), "\n"); }
  if (s.cuda_pool_per_gpu) { absl::StrAppend(&out, per_gpu_lines(*s.cuda_pool_per_gpu)); }
  absl::StrAppendFormat(&out,
                        "quotas: per session %s, per uid %s, %d per-uid override(s)\n",
                        bytes_or_none(s.quotas.per_session_bytes),
                        bytes_or_none(s.quotas.per_uid_bytes),
                        s.quotas.per_uid_overrides.size());
  absl::StrAppendFormat(
      &out,
      "tenancy: %s%s\n",
      s.tenancy.isolate ? "per uid (memory of its own per uid and pool)"
                        : "shared (one pool per GPU for everyone)",
      s.tenancy.shared_gids.empty()
          ? std::string()
          : absl::StrCat(", shared by gid: ", absl::StrJoin(s.tenancy.shared_gids, ", ")));
  absl::StrAppendFormat(&out,
                        "admission: %d silent connection(s) per uid, %d in all; %d session(s) per "
                        "uid, %d in all\n",
                        s.admission.max_pending_per_uid,
                        s.admission.max_pending_total,
                        s.admission.max_sessions_per_uid,
                        s.admission.max_sessions_total);
  absl::StrAppendFormat(
      &out,
      "drain %d ms, hello %d ms, reclaim %d ms, packed leases up to %d bytes, max message %d "
      "bytes, metrics %s (top %d sessions), log level %s\n",
      s.drain_timeout.count(),
      s.hello_timeout.count(),
      s.reclaim_timeout.count(),
      s.pack_up_to,
      s.max_message_bytes,
      s.metrics_address.empty() ? std::string("off") : s.metrics_address,
      s.metrics_top_sessions,
      level_name(s.log_level));
  return out;
}

}  // namespace rmmd::config
