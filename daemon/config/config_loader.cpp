#include "daemon/config/config_loader.hpp"

#include "common/system_user.hpp"
#include "rmmd/v1/config.pb.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

namespace rmmd::config {
namespace {

namespace pb    = google::protobuf;
using info_tree = pb::TextFormat::ParseInfoTree;

/// Longest drain an operator may ask for (systemd's TimeoutStopSec must cover it).
constexpr std::uint32_t max_drain_ms      = 3'600'000;
constexpr std::uint32_t max_hello_ms      = 600'000;
constexpr std::uint32_t max_reclaim_ms    = 60'000;
constexpr std::uint64_t min_message_bytes = 4096;
/// Largest admission limit: far above any node's processes, and below any fd limit.
constexpr std::uint32_t max_admission_limit = 1'000'000;
// Beyond this a scrape is as large as the per-session series were meant to avoid.
constexpr std::uint32_t max_metrics_top_sessions = 10'000;
/// A socket path must fit sockaddr_un::sun_path (108 bytes with the NUL).
constexpr std::size_t max_socket_path = 107;

/// Collects the parser's errors, 1-based.
class error_collector final : public pb::io::ErrorCollector {
 public:
  explicit error_collector(std::vector<config_error>& errors) : errors_(errors) {}

  void AddError(int line, pb::io::ColumnNumber column, std::string const& message) override
  {
    errors_.push_back(config_error{
        .line = line < 0 ? 0 : line + 1, .column = line < 0 ? 0 : column + 1, .message = message});
  }
  void AddWarning(int, pb::io::ColumnNumber, std::string const&) override {}

 private:
  std::vector<config_error>& errors_;
};

/// An octal mode as written in the file ("0660", "750"); nullopt if it is not one.
std::optional<mode_t> parse_mode(std::string const& text)
{
  if (text.size() < 3 || text.size() > 4) { return std::nullopt; }
  mode_t mode = 0;
  for (char c : text) {
    if (c < '0' || c > '7') { return std::nullopt; }
    mode = mode * 8 + static_cast<mode_t>(c - '0');
  }
  return mode;
}

/// "HOST:PORT" or "[IPV6]:PORT"; an empty string if it is well formed, else why not.
std::string check_address(std::string const& address)
{
  std::string host, port;
  if (!address.empty() && address.front() == '[') {
    auto close = address.find("]:");
    if (close == std::string::npos) { return "an IPv6 address is written \"[ADDRESS]:PORT\""; }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string::npos) { return "it has no port; write \"HOST:PORT\""; }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      return "an IPv6 address is written in brackets, \"[::1]:9464\"";
    }
  }
  if (host.empty()) { return "the host is empty; write \"127.0.0.1:PORT\" for this node only"; }
  std::uint32_t number = 0;
  if (port.empty() || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &number) || number == 0 || number > 65535) {
    return absl::StrFormat("the port \"%s\" is not a number from 1 to 65535", port);
  }
  return {};
}

/// A GPU UUID ("GPU-" and 32 hex digits in groups of 8-4-4-4-12) or a PCI bus
/// id ("0000:3b:00.0" or "3b:00.0"), as `gpu` takes them.
bool is_gpu_selector(std::string const& text)
{
  auto hex       = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
  auto groups_of = [&](std::string_view s, std::vector<std::size_t> const& sizes, char sep) {
    std::size_t at = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      for (std::size_t k = 0; k < sizes[i]; ++k, ++at) {
        if (at >= s.size() || !hex(s[at])) { return false; }
      }
      char const want = i + 2 == sizes.size() && sep == ':' ? '.' : sep;
      if (i + 1 < sizes.size()) {
        if (at >= s.size() || s[at] != want) { return false; }
        ++at;
      }
    }
    return at == s.size();
  };
  std::string_view s = text;
  if (s.size() > 4 && (s.starts_with("GPU-") || s.starts_with("gpu-"))) {
    return groups_of(s.substr(4), {8, 4, 4, 4, 12}, '-');
  }
  return groups_of(s, {4, 2, 2, 1}, ':') || groups_of(s, {8, 2, 2, 1}, ':') ||
         groups_of(s, {2, 2, 1}, ':');
}

bool valid_pool_name(std::string const& name)
{
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
  });
}

/// One message of the file: its parse tree and where it starts, so an error
/// about a field that is absent can point at the message that lacks it.
struct node {
  info_tree const* tree{};
  pb::Message const* message{};
  int line{};    // 1-based; 0: unknown
  int column{};  // 1-based
};

/// Checks a parsed DaemonConfig and builds the settings; every problem is
/// added to `errors_` at the field it concerns.
class validator {
 public:
  validator(v1::DaemonConfig const& config,
            info_tree const& tree,
            std::vector<config_error>& errors)
      : config_(config), errors_(errors), root_{&tree, &config, 1, 1}
  {
  }

  daemon_settings run()
  {
    auto s = default_settings();
    check_runtime(s);
    check_access(s);
    check_pools(s);
    check_quotas(s);
    check_admission(s);
    check_timing(s);
    return s;
  }

 private:
  /// Location of `field` (the index-th value of a repeated one) in `n`, or
  /// of `n` itself when the file does not set it.
  ///
  /// The parser records one location per occurrence of a field name, so the
  /// values of a list (`allowed_users: ["a", "b"]`) share one: there the
  /// first occurrence of the field is the best there is.
  std::pair<int, int> where(node const& n, std::string_view field, int index = -1) const
  {
    auto const* fd = n.message->GetDescriptor()->FindFieldByName(std::string(field));
    if (n.tree == nullptr || fd == nullptr) { return {n.line, n.column}; }
    int at = -1;
    if (fd->is_repeated()) {
      auto const values = n.message->GetReflection()->FieldSize(*n.message, fd);
      bool const exact  = n.tree->GetLocation(fd, std::max(values - 1, 0)).line >= 0;
      at                = exact ? std::max(index, 0) : 0;
    }
    auto const loc = n.tree->GetLocation(fd, at);
    if (loc.line >= 0) { return {loc.line + 1, loc.column + 1}; }
    return {n.line, n.column};
  }

  template <typename... Args>
  void error(node const& n,
             std::string_view field,
             int index,
             absl::FormatSpec<Args...> const& format,
             Args const&... args)
  {
    auto [line, column] = where(n, field, index);
    errors_.push_back(
        config_error{.line = line, .column = column, .message = absl::StrFormat(format, args...)});
  }

  /// The node of a nested message field (index-th of a repeated one).
  node nested(node const& parent, std::string_view field, int index = -1) const
  {
    auto const* fd      = parent.message->GetDescriptor()->FindFieldByName(std::string(field));
    auto [line, column] = where(parent, field, index);
    info_tree const* t  = nullptr;
    if (parent.tree != nullptr) {
      t = parent.tree->GetTreeForNested(fd, fd->is_repeated() ? index : -1);
    }
    auto const* reflection = parent.message->GetReflection();
    auto const& child      = fd->is_repeated()
                                 ? reflection->GetRepeatedMessage(*parent.message, fd, index)
                                 : reflection->GetMessage(*parent.message, fd);
    return node{t, &child, line, column};
  }

  void check_runtime(daemon_settings& s)
  {
    if (!config_.runtime_dir().empty()) {
      std::filesystem::path dir = config_.runtime_dir();
      if (!dir.is_absolute()) {
        error(root_,
              "runtime_dir",
              -1,
              "runtime_dir \"%s\" is relative; give an absolute path such as \"/run/rmmd\"",
              config_.runtime_dir());
      } else if ((dir / "rmmd-session.sock").native().size() > max_socket_path) {
        error(root_,
              "runtime_dir",
              -1,
              "runtime_dir \"%s\" is too long: a socket path in it must fit in %d bytes",
              config_.runtime_dir(),
              max_socket_path);
      } else {
        s.runtime_dir = dir;
      }
    }
    if (auto const& g = config_.socket_group(); !g.empty()) {
      std::uint32_t gid = 0;
      if (std::all_of(g.begin(), g.end(), absl::ascii_isdigit) && absl::SimpleAtoi(g, &gid)) {
        s.socket_group = gid;
      } else if (auto found = common::find_group(g)) {
        s.socket_group = *found;
      } else {
        error(root_,
              "socket_group",
              -1,
              "socket_group \"%s\": no such group; create it (the package's sysusers.d file "
              "creates \"rmmd\") or give another group name or gid",
              g);
      }
      s.socket_group_name = g;
    }
    if (!config_.runtime_dir_mode().empty()) {
      auto mode = parse_mode(config_.runtime_dir_mode());
      if (!mode || *mode > 07777) {
        error(root_,
              "runtime_dir_mode",
              -1,
              "runtime_dir_mode \"%s\" is not an octal mode; write it like \"0750\"",
              config_.runtime_dir_mode());
      } else if ((*mode & 0700) != 0700) {
        error(root_,
              "runtime_dir_mode",
              -1,
              "runtime_dir_mode \"%s\" must give the owner rwx (0700): the daemon creates its "
              "sockets there",
              config_.runtime_dir_mode());
      } else {
        s.runtime_dir_mode = *mode;
      }
    }
    if (!config_.socket_mode().empty()) {
      auto mode = parse_mode(config_.socket_mode());
      if (!mode || *mode > 0777) {
        error(root_,
              "socket_mode",
              -1,
              "socket_mode \"%s\" is not an octal permission mode; write it like \"0660\"",
              config_.socket_mode());
      } else if ((*mode & 0600) != 0600) {
        error(root_,
              "socket_mode",
              -1,
              "socket_mode \"%s\" must give the owner read and write (0600)",
              config_.socket_mode());
      } else {
        s.socket_mode = *mode;
      }
    }
  }

  void check_access(daemon_settings& s)
  {
    bool const any = config_.allowed_uids_size() + config_.allowed_gids_size() +
                         config_.allowed_users_size() + config_.allowed_groups_size() >
                     0;
    if (!any) { return; }  // the default policy stays
    s.access_is_default = false;
    s.access            = {};
    for (auto uid : config_.allowed_uids()) { s.access.uids.push_back(uid); }
    for (auto gid : config_.allowed_gids()) { s.access.gids.push_back(gid); }
    for (int i = 0; i < config_.allowed_users_size(); ++i) {
      auto const& name = config_.allowed_users(i);
      if (auto user = common::find_user(name)) {
        s.access.uids.push_back(user->uid);
      } else {
        error(root_,
              "allowed_users",
              i,
              "allowed_users: no user named \"%s\" on this system; give an existing user name or "
              "its uid in allowed_uids",
              name);
      }
    }
    for (int i = 0; i < config_.allowed_groups_size(); ++i) {
      auto const& name = config_.allowed_groups(i);
      if (auto gid = common::find_group(name)) {
        s.access.gids.push_back(*gid);
      } else {
        error(root_,
              "allowed_groups",
              i,
              "allowed_groups: no group named \"%s\" on this system; give an existing group name "
              "or its gid in allowed_gids",
              name);
      }
    }
  }

  void check_pools(daemon_settings& s)
  {
    if (config_.pools_size() == 0) { return; }  // the built-in pool set stays
    s.pools.clear();
    s.gpu_pool_per_device = false;
    std::map<std::string, int> first_line;  // name -> line of its first definition
    for (int i = 0; i < config_.pools_size(); ++i) {
      auto const& p = config_.pools(i);
      auto const n  = nested(root_, "pools", i);
      auto label    = p.name().empty() ? absl::StrFormat("pools[%d]", i)
                                       : absl::StrFormat("pool \"%s\"", p.name());
      pool_settings out;
      out.line = n.line;
      out.name = p.name();
      if (p.name().empty()) {
        error(n, "name", -1, "%s has no name; give it one, e.g. name: \"gpu0\"", label);
      } else if (!valid_pool_name(p.name())) {
        error(n,
              "name",
              -1,
              "pool name \"%s\" may hold only letters, digits, '.', '_' and '-' (at most 64)",
              p.name());
      } else if (auto [it, fresh] = first_line.emplace(p.name(), n.line); !fresh) {
        error(n,
              "name",
              -1,
              "pool name \"%s\" is already used by the pool at line %d; pool names must be unique",
              p.name(),
              it->second);
      }
      switch (p.backend()) {
        case v1::Pool::HOST:
          check_host_pool(p, n, label, out);
          break;
        case v1::Pool::CUDA:
          check_cuda_pool(p, n, label, out);
          break;
        default:
          error(n,
                "backend",
                -1,
                "%s has no backend; add `backend: HOST` (shared host memory) or `backend: CUDA`",
                label);
      }
      s.pools.push_back(std::move(out));
    }
  }

  void check_host_pool(v1::Pool const& p,
                       node const& n,
                       std::string const& label,
                       pool_settings& out)
  {
    out.backend    = core::backend_kind::host;
    out.device     = -1;
    auto cuda_only = [&](std::string_view field) {
      error(n,
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
      error(n,
            "capacity_bytes",
            -1,
            "%s: capacity_bytes is 0; give the pool a size, e.g. 1073741824 (1 GiB)",
            label);
    }
  }

  void check_cuda_pool(v1::Pool const& p,
                       node const& n,
                       std::string const& label,
                       pool_settings& out)
  {
    out.backend = core::backend_kind::cuda;
    out.device  = p.has_device() ? p.device() : 0;
    if (out.device < 0) {
      error(n,
            "device",
            -1,
            "%s: device %d is negative; give a CUDA device ordinal",
            label,
            out.device);
    }
    if (p.has_gpu()) {
      out.gpu = p.gpu();
      if (p.has_device()) {
        error(n,
              "gpu",
              -1,
              "%s: both device and gpu name the GPU; keep gpu (the same in every process)",
              label);
      } else if (!is_gpu_selector(out.gpu)) {
        error(n,
              "gpu",
              -1,
              "%s: gpu \"%s\" is neither a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, "
              "as nvidia-smi -L prints it) nor a PCI bus id (0000:3b:00.0)",
              label,
              out.gpu);
      }
    }
    if (p.has_capacity_bytes()) {
      error(n,
            "capacity_bytes",
            -1,
            "%s: capacity_bytes applies to host pools only; a CUDA pool is bounded by limit_bytes",
            label);
    }
    if (p.has_pinnable()) {
      error(n,
            "pinnable",
            -1,
            "%s: pinnable applies to host pools only (CUDA pool memory is device memory)",
            label);
    }
    bool posix = false, fabric = false;
    for (int i = 0; i < p.handle_types_size(); ++i) {
      auto t     = p.handle_types(i);
      bool& seen = t == v1::Pool::POSIX_FD ? posix : fabric;
      if (t != v1::Pool::POSIX_FD && t != v1::Pool::FABRIC) {
        error(n, "handle_types", i, "%s: handle type %d is not POSIX_FD or FABRIC", label, t);
      } else if (seen) {
        error(n,
              "handle_types",
              i,
              "%s: handle type %s is listed twice",
              label,
              v1::Pool::HandleType_Name(t));
      }
      seen = true;
    }
    if (p.handle_types_size() == 0) {
      out.fabric = fabric_mode::automatic;
    } else if (!posix) {
      error(n,
            "handle_types",
            0,
            "%s: handle_types must include POSIX_FD (every CUDA pool exports its fd); write "
            "[POSIX_FD, FABRIC] to require fabric handles",
            label);
    } else {
      out.fabric = fabric ? fabric_mode::required : fabric_mode::off;
    }
    out.initial_size_bytes      = p.initial_size_bytes();
    out.release_threshold_bytes = p.release_threshold_bytes();
    if (p.has_limit_bytes()) {
      out.limit_bytes = p.limit_bytes();
      if (out.limit_bytes == 0) {
        error(n,
              "limit_bytes",
              -1,
              "%s: limit_bytes is 0; give the most bytes the pool may lend, or leave it out for "
              "80%% of the GPU's free memory",
              label);
      } else {
        if (out.release_threshold_bytes > out.limit_bytes) {
          error(n,
                "release_threshold_bytes",
                -1,
                "%s: release_threshold_bytes (%d) is larger than limit_bytes (%d); lower the "
                "threshold or raise the limit",
                label,
                out.release_threshold_bytes,
                out.limit_bytes);
        }
        if (out.initial_size_bytes > out.limit_bytes) {
          error(n,
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

  void check_quotas(daemon_settings& s)
  {
    if (!config_.has_quotas()) { return; }
    auto const& q              = config_.quotas();
    auto const n               = nested(root_, "quotas");
    s.quotas.per_session_bytes = q.per_session_bytes();
    s.quotas.per_uid_bytes     = q.per_uid_bytes();
    std::map<uid_t, int> first_line;
    for (int i = 0; i < q.uid_overrides_size(); ++i) {
      auto const& o = q.uid_overrides(i);
      auto const on = nested(n, "uid_overrides", i);
      std::optional<uid_t> uid;
      switch (o.who_case()) {
        case v1::UidQuota::kUid:
          uid = o.uid();
          break;
        case v1::UidQuota::kUser:
          if (auto user = common::find_user(o.user())) { uid = user->uid; }
          if (!uid) {
            error(on,
                  "user",
                  -1,
                  "uid_overrides: no user named \"%s\" on this system; give an existing user "
                  "name or a uid",
                  o.user());
          }
          break;
        default:
          error(on,
                "uid",
                -1,
                "uid_overrides[%d] names nobody; give `uid: N` or `user: \"NAME\"`",
                i);
      }
      if (!uid) { continue; }
      if (auto [it, fresh] = first_line.emplace(*uid, on.line); !fresh) {
        error(on,
              o.has_user() ? "user" : "uid",
              -1,
              "uid_overrides: uid %d already has a quota at line %d; give each uid one override",
              *uid,
              it->second);
        continue;
      }
      s.quotas.per_uid_overrides[*uid] = o.bytes();
    }
  }

  void check_admission(daemon_settings& s)
  {
    if (!config_.has_admission()) { return; }
    auto const& a = config_.admission();
    auto const n  = nested(root_, "admission");
    // Each limit as written (or its default), checked for range.
    auto limit = [&](std::string_view field, bool given, std::uint32_t value, std::size_t& out) {
      if (!given) { return; }
      if (value == 0 || value > max_admission_limit) {
        error(n,
              field,
              -1,
              "admission.%s %d is out of range; give 1 to %d",
              field,
              value,
              max_admission_limit);
        return;
      }
      out = value;
    };
    auto& l = s.admission;
    limit("max_pending_per_uid",
          a.has_max_pending_per_uid(),
          a.max_pending_per_uid(),
          l.max_pending_per_uid);
    limit(
        "max_pending_total", a.has_max_pending_total(), a.max_pending_total(), l.max_pending_total);
    limit("max_sessions_per_uid",
          a.has_max_sessions_per_uid(),
          a.max_sessions_per_uid(),
          l.max_sessions_per_uid);
    limit("max_sessions_total",
          a.has_max_sessions_total(),
          a.max_sessions_total(),
          l.max_sessions_total);
    // A per-uid limit above its total is an error where it was written.
    if (l.max_pending_per_uid > l.max_pending_total) {
      error(n,
            a.has_max_pending_per_uid() ? "max_pending_per_uid" : "max_pending_total",
            -1,
            "%s",
            per_uid_above_total("pending", l.max_pending_per_uid, l.max_pending_total));
    }
    if (l.max_sessions_per_uid > l.max_sessions_total) {
      error(n,
            a.has_max_sessions_per_uid() ? "max_sessions_per_uid" : "max_sessions_total",
            -1,
            "%s",
            per_uid_above_total("sessions", l.max_sessions_per_uid, l.max_sessions_total));
    }
  }

  void check_timing(daemon_settings& s)
  {
    if (config_.has_drain_timeout_ms()) {
      if (config_.drain_timeout_ms() > max_drain_ms) {
        error(root_,
              "drain_timeout_ms",
              -1,
              "drain_timeout_ms %d is longer than the most allowed, %d (one hour)",
              config_.drain_timeout_ms(),
              max_drain_ms);
      }
      s.drain_timeout = std::chrono::milliseconds(config_.drain_timeout_ms());
    }
    if (config_.has_hello_timeout_ms()) {
      if (config_.hello_timeout_ms() == 0 || config_.hello_timeout_ms() > max_hello_ms) {
        error(root_,
              "hello_timeout_ms",
              -1,
              "hello_timeout_ms %d is out of range; give 1 to %d",
              config_.hello_timeout_ms(),
              max_hello_ms);
      }
      s.hello_timeout = std::chrono::milliseconds(config_.hello_timeout_ms());
    }
    if (config_.has_reclaim_timeout_ms()) {
      if (config_.reclaim_timeout_ms() > max_reclaim_ms) {
        error(root_,
              "reclaim_timeout_ms",
              -1,
              "reclaim_timeout_ms %d is longer than the most allowed, %d (one minute); give 0 "
              "to refuse a short pool's requests at once",
              config_.reclaim_timeout_ms(),
              max_reclaim_ms);
      }
      s.reclaim_timeout = std::chrono::milliseconds(config_.reclaim_timeout_ms());
    }
    if (config_.has_pack_up_to_bytes()) {
      if (config_.pack_up_to_bytes() > core::default_pack_block_size) {
        error(root_,
              "pack_up_to_bytes",
              -1,
              "pack_up_to_bytes %d is larger than a packed block (%d bytes); give at most that, "
              "or 0 to give every allocation a driver allocation of its own",
              config_.pack_up_to_bytes(),
              core::default_pack_block_size);
      }
      s.pack_up_to = config_.pack_up_to_bytes();
    }
    if (config_.has_max_message_bytes()) {
      auto bytes = config_.max_message_bytes();
      if (bytes < min_message_bytes || bytes > static_cast<std::uint64_t>(INT_MAX)) {
        error(root_,
              "max_message_bytes",
              -1,
              "max_message_bytes %d is out of range; give %d to %d",
              bytes,
              min_message_bytes,
              INT_MAX);
      }
      s.max_message_bytes = bytes;
    }
    if (!config_.metrics_address().empty()) {
      if (auto why = check_address(config_.metrics_address()); !why.empty()) {
        error(root_,
              "metrics_address",
              -1,
              "metrics_address \"%s\": %s",
              config_.metrics_address(),
              why);
      }
      s.metrics_address = config_.metrics_address();
    }
    if (config_.has_metrics_top_sessions()) {
      if (config_.metrics_top_sessions() > max_metrics_top_sessions) {
        error(root_,
              "metrics_top_sessions",
              -1,
              "metrics_top_sessions %d is out of range; give 0 (no per-session series) to %d",
              config_.metrics_top_sessions(),
              max_metrics_top_sessions);
      }
      s.metrics_top_sessions = config_.metrics_top_sessions();
    }
    switch (config_.log_level()) {
      case v1::DaemonConfig::ERROR:
        s.log_level = log::level::error;
        break;
      case v1::DaemonConfig::WARNING:
        s.log_level = log::level::warning;
        break;
      case v1::DaemonConfig::DEBUG:
        s.log_level = log::level::debug;
        break;
      default:
        s.log_level = log::level::info;
        break;
    }
  }

  v1::DaemonConfig const& config_;
  std::vector<config_error>& errors_;
  node root_;
};

}  // namespace

std::string format_error(std::filesystem::path const& file, config_error const& error)
{
  if (error.line <= 0) { return absl::StrCat(file.string(), ": ", error.message); }
  return absl::StrFormat("%s:%d:%d: %s", file.string(), error.line, error.column, error.message);
}

load_result parse_config(std::string_view text)
{
  load_result result;
  v1::DaemonConfig config;
  info_tree tree;
  error_collector collector(result.errors);
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&collector);
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(std::string(text), &config)) {
    if (result.errors.empty()) {  // the parser always says why; this is a safety net
      result.errors.push_back(config_error{.message = "not a valid rmmd.v1.DaemonConfig text"});
    }
    return result;
  }
  auto settings = validator(config, tree, result.errors).run();
  std::stable_sort(result.errors.begin(), result.errors.end(), [](auto const& a, auto const& b) {
    return std::tie(a.line, a.column) < std::tie(b.line, b.column);
  });
  if (result.errors.empty()) { result.settings = std::move(settings); }
  return result;
}

load_result load_config_file(std::filesystem::path const& path)
{
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    load_result result;
    result.errors.push_back(
        config_error{.message = "cannot read the configuration file: it is a directory"});
    return result;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    load_result result;
    result.errors.push_back(config_error{
        .message = absl::StrCat("cannot read the configuration file: ", std::strerror(errno))});
    return result;
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    load_result result;
    result.errors.push_back(config_error{
        .message = absl::StrCat("cannot read the configuration file: ", std::strerror(errno))});
    return result;
  }
  return parse_config(text.str());
}

}  // namespace rmmd::config
