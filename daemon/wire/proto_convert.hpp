#pragma once

// Core value types -> wire messages. Used by the gRPC service and the session
// socket, so both describe pools and sessions the same way.

#include "daemon/core/daemon_core.hpp"
#include "daemon/core/types.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <map>
#include <optional>
#include <string>

namespace rmmd::wire {

/// `fd_index` is the pool fd's position among the fds attached to a welcome,
/// or -1.
void to_proto(core::pool_description const& in, int fd_index, v1::PoolDescription* out);
void to_proto(core::session_info const& in, v1::SessionInfo* out);
void to_proto(core::pool_stats const& in, v1::PoolStats* out);
void to_proto(core::stats_snapshot const& in, v1::Stats* out);
void to_proto(core::session_listing const& in, v1::ListSessionsResponse* out);
void to_proto(core::pool_trim const& in, v1::PoolTrim* out);
void to_proto(core::lease_grant const& in, v1::AllocateResponse* out);
void to_proto(core::buffer_grant const& in, v1::BufferGrant* out);
void to_proto(core::buffer_info const& in, v1::BufferInfo* out);
void to_proto(core::buffer_lease_info const& in, v1::BufferLease* out);
v1::BufferState to_proto(core::buffer_state state);
/// A CreateBufferRequest's options.
core::buffer_options from_proto(v1::CreateBufferRequest const& in);
/// Labels travel as repeated Label messages (no map fields: DEVELOPERS.md).
void to_proto(std::map<std::string, std::string> const& in,
              google::protobuf::RepeatedPtrField<v1::Label>* out);
/// The first value of each key (repeated_label_key() finds a repeated one).
std::map<std::string, std::string> from_proto(
    google::protobuf::RepeatedPtrField<v1::Label> const& in);
/// A key that `labels` name twice, for the caller to refuse; none: nullopt.
std::optional<std::string> repeated_label_key(
    google::protobuf::RepeatedPtrField<v1::Label> const& labels);
void to_proto(core::buffer_manifest const& in, v1::BufferManifest* out);
core::buffer_manifest from_proto(v1::BufferManifest const& in);
/// An OpenBufferRequest's access and expected labels.
core::buffer_open_options from_proto(v1::OpenBufferRequest const& in);
core::buffer_filter from_proto(v1::ListBuffersRequest const& in);

}  // namespace rmmd::wire
