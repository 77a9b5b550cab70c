#pragma once

// A buffer as string APIs name it: NAME (a buffer of this node) or NODE:NAME
// (a buffer of another node of the NVLink domain, opened through this node's
// daemon, docs/operations.md "Across nodes"). ':' is allowed in neither part,
// so the split is unambiguous ('/' would not be: names contain it). The
// client library checks an address before it asks (a wrong one costs no
// round trip); the node rule is the one peering.node_name and
// peering.peers[].name follow. Header-only, the standard library only.

#include "common/buffer_name.hpp"

#include <cstddef>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace rmmd::names {

inline constexpr std::size_t max_node_name_bytes = 253;

inline constexpr std::string_view node_name_rule =
    "a node name is 1 to 253 bytes of A-Z a-z 0-9 . _ - (a host name will do)";

/// Why `node` is not a valid node name, or nullopt when it is one.
inline std::optional<std::string> node_name_problem(std::string_view node)
{
  auto because = [](std::string why) { return why + "; " + std::string(node_name_rule); };
  if (node.empty()) { return because("the node name is empty"); }
  if (node.size() > max_node_name_bytes) {
    return because("the node name has " + std::to_string(node.size()) + " bytes");
  }
  for (std::size_t i = 0; i < node.size(); ++i) {
    char const c  = node[i];
    bool const ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02x", static_cast<unsigned char>(c));
      return because("byte " + std::to_string(i) + " of the node name (" + hex +
                     ") is not allowed");
    }
  }
  return std::nullopt;
}

/// A buffer address split: `node` empty for a buffer of this node.
struct buffer_address {
  std::string node;
  std::string name;
};

/// Splits `address` (NAME or NODE:NAME) and checks both parts; `peer`, where
/// not empty, names the node as well (an API's separate argument): it must
/// agree with a NODE: in the address. On success returns the parts and
/// leaves `problem` alone; otherwise nullopt and `problem` says why in words.
inline std::optional<buffer_address> parse_buffer_address(std::string_view address,
                                                          std::string_view peer,
                                                          std::string* problem)
{
  buffer_address out;
  auto const colon = address.find(':');
  if (colon == std::string_view::npos) {
    out.name = address;
  } else {
    if (address.find(':', colon + 1) != std::string_view::npos) {
      *problem = "it has ':' twice; a buffer of another node is NODE:NAME, with one ':'";
      return std::nullopt;
    }
    out.node = address.substr(0, colon);
    out.name = address.substr(colon + 1);
    if (out.node.empty()) {
      *problem = "the node before ':' is empty; write NODE:NAME, or NAME for a buffer of this node";
      return std::nullopt;
    }
  }
  if (!peer.empty()) {
    if (!out.node.empty() && out.node != peer) {
      *problem = "it names node '" + out.node + "' and the peer option names node '" +
                 std::string(peer) + "'";
      return std::nullopt;
    }
    out.node = peer;
  }
  if (!out.node.empty()) {
    if (auto why = node_name_problem(out.node)) {
      *problem = *why;
      return std::nullopt;
    }
  }
  if (auto why = buffer_name_problem(out.name)) {
    *problem = *why;
    return std::nullopt;
  }
  return out;
}

}  // namespace rmmd::names
