#pragma once

#include "rmmd/v1/rmmd.pb.h"

#include <string>

namespace rmmd::ctl {

/// "1.50 GiB", "256 B": sizes as people read them.
std::string human_bytes(std::uint64_t bytes);

/// The pools and sessions of `stats` as two aligned tables.
std::string format_stats(v1::Stats const& stats);

/// protobuf's JSON mapping of `message` (field names as in the .proto).
std::string to_json(google::protobuf::Message const& message);

}  // namespace rmmd::ctl
