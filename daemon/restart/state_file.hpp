#pragma once

// The state file: the registry of buffers and sleep backups whose fds rmmd
// keeps in systemd's fd store (rmmd.v1.BufferRegistryState,
// proto/rmmd/v1/state.proto), written whenever that set changes and read
// once at start.
//
// On disk: 8 bytes of magic "RMMDST01", the payload's length (u64, little
// endian), the payload's CRC-32C (u32, little endian), then the payload, a
// serialized BufferRegistryState. A reader accepts a file only whole: the
// magic, the exact length, the checksum, the protobuf, the format version
// and every record's own rules (state_problem) must hold, or it says in words
// which did not; it never returns part of a state.
//
// Writing is atomic: a temporary file in the same directory (mode 0600),
// written, fsync'd, renamed over the old one, and the directory fsync'd; a
// crash at any point leaves the old file or the new one, never a mix.
//
// Thread safety: free functions with no shared state; two writers of one
// path must be serialised by the caller.

#include "rmmd/v1/state.pb.h"

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace rmmd::restart {

/// The BufferRegistryState.format_version this rmmd writes and reads.
inline constexpr std::uint32_t state_format_version = 1;
/// The file's first bytes.
inline constexpr std::string_view state_file_magic = "RMMDST01";
/// Magic, length and checksum.
inline constexpr std::size_t state_file_header_bytes = 8 + 8 + 4;
/// A larger payload is refused unread (a registry of 4096 buffers with
/// manifests is far below it).
inline constexpr std::uint64_t max_state_payload_bytes = 64ull << 20;

/// What is wrong with `state` beyond its framing, or nullopt: the format
/// version; per record, a valid FDNAME whose number is fd_id, a valid buffer
/// name, size > 0, allocation_bytes >= size, a known kind, a GPU UUID exactly
/// for CUDA kinds, the state PUBLISHED (only published buffers are stored),
/// fd_id < next_fd_id; no two records with the same fd_name, fd_id or name.
/// Per backup record: a backup's FDNAME whose number is fd_id < next_fd_id,
/// a valid backup name and tag, size > 0, size <= allocation_bytes <=
/// backup_bytes, a pool and a host pool named; no fd_name or fd_id that
/// another record (a buffer's or a backup's) has.
[[nodiscard]] std::optional<std::string> state_problem(v1::BufferRegistryState const& state);

/// The file's bytes for `state` (header and payload). Does not check it.
[[nodiscard]] std::string encode_state(v1::BufferRegistryState const& state);

/// Reads a file's bytes: the state, or an error (INVALID_ARGUMENT for a
/// truncated, corrupt or foreign file, FAILED_PRECONDITION for another
/// format version or a record that breaks the rules) saying what is wrong.
[[nodiscard]] absl::StatusOr<v1::BufferRegistryState> decode_state(std::string_view bytes);

/// Writes `state` to `path` atomically (above). REQUIRES: state_problem(state)
/// is nullopt (an error otherwise, and nothing written). Errors name the
/// step and errno; the old file is then untouched and no temporary is left.
absl::Status write_state_file(std::filesystem::path const& path,
                              v1::BufferRegistryState const& state);

/// The state in `path`; nullopt if there is no file (a first start). Errors:
/// as decode_state, prefixed with the path; and a file that cannot be read.
[[nodiscard]] absl::StatusOr<std::optional<v1::BufferRegistryState>> read_state_file(
    std::filesystem::path const& path);

}  // namespace rmmd::restart
