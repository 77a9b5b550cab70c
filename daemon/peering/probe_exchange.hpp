#pragma once

// The fabric probe as peering sees it, without CUDA: the probe this node
// exports, and how it judges another node's (main wires the CUDA backend's
// peer_probe in; tests and hosts without a fabric pool use no_fabric_probe).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd::peering {

/// FabricProbe in peer.proto.
struct fabric_probe {
  std::vector<std::byte> fabric_handle{};  ///< empty: this node exports none (`problem` says why)
  std::uint64_t bytes{};
  std::uint64_t pattern{};
  std::string gpu_uuid{};
  std::string problem{};
};

/// ProbeResult in peer.proto: the importer's verdict.
struct probe_verdict {
  bool ok{false};
  std::string problem{};
};

struct probe_exchange {
  fabric_probe ours{};
  /// Imports another node's probe and reads it back. Called from gRPC's
  /// and the dialers' threads.
  std::function<probe_verdict(fabric_probe const& theirs)> import;
  /// One granule per GPU with a fabric pool (`ours` among them), exported
  /// for other nodes' clients to keep mapped (RemoteGrant.anchor); each
  /// names its GPU. Read-only after start; `anchor_memory` keeps them.
  std::vector<fabric_probe> anchors{};
  std::shared_ptr<void const> anchor_memory{};

  /// The anchor of GPU `gpu_uuid`; nullptr where there is none.
  [[nodiscard]] fabric_probe const* anchor_of(std::string_view gpu_uuid) const noexcept
  {
    for (auto const& a : anchors) {
      if (a.gpu_uuid == gpu_uuid && !a.fabric_handle.empty()) { return &a; }
    }
    return nullptr;
  }
};

inline constexpr char const* no_fabric_pool_problem =
    "this node has no CUDA pool with fabric handles";

/// A node without a CUDA pool that exports fabric handles: its probe is
/// empty, and it can import none.
inline probe_exchange no_fabric_probe()
{
  return probe_exchange{.ours   = fabric_probe{.problem = no_fabric_pool_problem},
                        .import = [](fabric_probe const&) {
                          return probe_verdict{.ok = false, .problem = no_fabric_pool_problem};
                        }};
}

}  // namespace rmmd::peering
