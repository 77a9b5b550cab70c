#pragma once

// Between the public manifest types (include/rmmd/shared_buffer.hpp) and
// their wire messages. Private to librmmd_client and rmmd's tools.

#include <rmmd/shared_buffer.hpp>

#include "rmmd/v1/rmmd.pb.h"

namespace rmmd::detail {

/// `m` as the wire carries it (the daemon checks it; nothing is checked here).
void to_proto(buffer_manifest const& m, v1::BufferManifest* out);
/// The wire's manifest. A dtype this client does not know (a newer daemon's)
/// keeps its number: to_string() calls it "unknown" and itemsize() is 0.
[[nodiscard]] buffer_manifest from_proto(v1::BufferManifest const& m);
[[nodiscard]] buffer_info from_proto(v1::BufferInfo const& info);

/// `labels` into a protobuf map field (expect_labels, ListBuffersRequest's).
template <typename ProtoMap>
void copy_labels(std::map<std::string, std::string, std::less<>> const& labels, ProtoMap* out)
{
  for (auto const& [key, value] : labels) { (*out)[key] = value; }
}

}  // namespace rmmd::detail
