// peering: the node's name, its TLS files, the peers it dials, the grants,
// and the lease times (docs/configuration.md, "peering").

#include "daemon/config/detail/checks.hpp"
#include "daemon/config/detail/value_formats.hpp"

#include <absl/strings/str_cat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

namespace rmmd::config::detail {
namespace {

constexpr std::uint32_t min_lease_ms = 100;
constexpr std::uint32_t max_lease_ms = 3'600'000;

/// Why `name` cannot name a node (NODE:NAME in the client APIs), or "".
std::string node_name_problem(std::string const& name)
{
  if (name.empty()) { return "it is empty"; }
  if (name.size() > 253) { return "it is longer than 253 characters"; }
  for (char c : name) {
    if (c == ':' || c == '/') {
      return absl::StrCat(
          "it contains '", std::string(1, c), "', which the client APIs use to split NODE:NAME");
    }
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) {
      return "it contains a space or a control character";
    }
  }
  return {};
}

/// Why the file at `path` cannot be read, or "".
std::string unreadable(std::string const& path)
{
  std::ifstream in(path, std::ios::binary);
  if (!in) { return std::strerror(errno); }
  char c = 0;
  if (!in.get(c)) { return "it is empty"; }
  return {};
}

void check_tls(checked_file& f, node const& peering, daemon_settings& s)
{
  auto const& p = f.config().peering();
  if (!p.has_tls()) { return; }
  auto const tls = f.nested(peering, "tls");
  peer_tls_files files;
  bool ok          = true;
  auto check_field = [&](char const* field, std::string const& path, std::filesystem::path& out) {
    if (path.empty()) {
      f.error(tls, field, -1, "peering.tls.%s is not set; name a PEM file", field);
      ok = false;
    } else if (!std::filesystem::path(path).is_absolute()) {
      f.error(
          tls, field, -1, "peering.tls.%s \"%s\" is relative; give an absolute path", field, path);
      ok = false;
    } else if (auto why = unreadable(path); !why.empty()) {
      f.error(tls, field, -1, "peering.tls.%s \"%s\" cannot be read: %s", field, path, why);
      ok = false;
    }
    out = path;
  };
  check_field("certificate_file", p.tls().certificate_file(), files.certificate);
  check_field("private_key_file", p.tls().private_key_file(), files.private_key);
  check_field("trusted_ca_file", p.tls().trusted_ca_file(), files.trusted_ca);
  if (ok) { s.peering.tls = files; }
}

void check_peers(checked_file& f, node const& peering, daemon_settings& s)
{
  auto const& p = f.config().peering();
  std::set<std::string> names;
  for (int i = 0; i < p.peers_size(); ++i) {
    auto const& peer = p.peers(i);
    auto const at    = f.nested(peering, "peers", i);
    if (auto why = node_name_problem(peer.name()); !why.empty()) {
      f.error(at, "name", -1, "peering.peers[%d].name \"%s\": %s", i, peer.name(), why);
    } else if (peer.name() == s.peering.node_name) {
      f.error(at,
              "name",
              -1,
              "peering.peers[%d].name \"%s\" is this node's own name (peering.node_name); a "
              "daemon does not dial itself",
              i,
              peer.name());
    } else if (!names.insert(peer.name()).second) {
      f.error(at,
              "name",
              -1,
              "peering.peers[%d].name \"%s\" is named twice; each peer once",
              i,
              peer.name());
    }
    if (auto why = check_address(peer.address()); !why.empty()) {
      f.error(at, "address", -1, "peering.peers[%d].address \"%s\": %s", i, peer.address(), why);
    }
    s.peering.peers.push_back(peer_node_settings{.name            = peer.name(),
                                                 .address         = peer.address(),
                                                 .identity        = peer.identity(),
                                                 .tls_server_name = peer.tls_server_name()});
  }
}

void check_grants(checked_file& f, node const& peering, daemon_settings& s)
{
  auto const& p = f.config().peering();
  for (int i = 0; i < p.grants_size(); ++i) {
    auto const& grant = p.grants(i);
    auto const at     = f.nested(peering, "grants", i);
    if (grant.identity().empty()) {
      f.error(at,
              "identity",
              -1,
              "peering.grants[%d].identity is empty; give a certificate subject such as "
              "\"CN=rmmd-nodeB\", or \"*\" for any peer the trusted CA signed",
              i);
    }
    s.peering.grants.push_back(peer_grant_settings{
        .identity      = grant.identity(),
        .name_prefixes = {grant.name_prefixes().begin(), grant.name_prefixes().end()},
        .allow_writers = grant.allow_writers()});
  }
}

void check_lease_times(checked_file& f, node const& peering, daemon_settings& s)
{
  auto const& p = f.config().peering();
  auto ranged =
      [&](char const* field, bool has, std::uint32_t value, std::chrono::milliseconds& out) {
        if (!has) { return; }
        if (value < min_lease_ms || value > max_lease_ms) {
          f.error(peering,
                  field,
                  -1,
                  "peering.%s %d is out of range; give %d to %d",
                  field,
                  value,
                  min_lease_ms,
                  max_lease_ms);
          return;
        }
        out = std::chrono::milliseconds(value);
      };
  ranged("hold_lease_ms", p.has_hold_lease_ms(), p.hold_lease_ms(), s.peering.hold_lease);
  ranged("renew_interval_ms",
         p.has_renew_interval_ms(),
         p.renew_interval_ms(),
         s.peering.renew_interval);
  ranged("keepalive_ms", p.has_keepalive_ms(), p.keepalive_ms(), s.peering.keepalive);
  if (s.peering.renew_interval * 2 > s.peering.hold_lease) {
    f.error(peering,
            p.has_renew_interval_ms() ? "renew_interval_ms" : "hold_lease_ms",
            -1,
            "peering.renew_interval_ms (%d) must be at most half of peering.hold_lease_ms (%d): "
            "one late renewal would end every hold",
            s.peering.renew_interval.count(),
            s.peering.hold_lease.count());
  }
}

}  // namespace

void check_peering(checked_file& f, daemon_settings& s)
{
  if (!f.config().has_peering()) { return; }
  auto const& p      = f.config().peering();
  auto const peering = f.nested(f.root(), "peering");
  if (!p.node_name().empty()) {
    if (auto why = node_name_problem(p.node_name()); !why.empty()) {
      f.error(peering, "node_name", -1, "peering.node_name \"%s\": %s", p.node_name(), why);
    }
    s.peering.node_name = p.node_name();
  }
  if (!p.listen_address().empty()) {
    if (auto why = check_address(p.listen_address()); !why.empty()) {
      f.error(peering,
              "listen_address",
              -1,
              "peering.listen_address \"%s\": %s",
              p.listen_address(),
              why);
    }
    s.peering.listen_address = p.listen_address();
  }
  s.peering.insecure_plaintext_for_tests = p.insecure_plaintext_for_tests();
  check_tls(f, peering, s);
  check_peers(f, peering, s);
  check_grants(f, peering, s);
  check_lease_times(f, peering, s);
  if (s.peering.enabled() && !p.has_tls() && !p.insecure_plaintext_for_tests()) {
    f.error(peering,
            p.listen_address().empty() ? "peers" : "listen_address",
            -1,
            "peering: %s without peering.tls; give certificate_file, private_key_file and "
            "trusted_ca_file (peers talk mutual TLS), or set insecure_plaintext_for_tests "
            "(tests only: anyone on the network could open the granted buffers)",
            p.listen_address().empty() ? "peers are set" : "listen_address is set");
  }
}

}  // namespace rmmd::config::detail
