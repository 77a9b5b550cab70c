#pragma once

// The rules a buffer's manifest must keep (BufferManifest in rmmd.proto;
// docs/sharing.md, "Manifests"): each check returns nothing for a good
// input, or the problem in words, naming the tensor or label, for an
// INVALID_ARGUMENT. All arithmetic on sizes is checked for overflow: a
// manifest is the creator's input and may say anything. No state, no locks.

#include "daemon/core/types.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rmmd::core {

inline constexpr std::size_t max_manifest_tensors     = std::size_t{1} << 20;  // 1,048,576
inline constexpr std::size_t max_manifest_bytes       = std::size_t{4} << 20;  // serialized
inline constexpr std::size_t max_manifest_labels      = 256;
inline constexpr std::size_t max_label_key_bytes      = 128;
inline constexpr std::size_t max_label_value_bytes    = 4096;
inline constexpr std::size_t max_tensor_name_bytes    = 1024;
inline constexpr std::size_t max_tensor_dims          = 32;
inline constexpr std::string_view daemon_label_prefix = "rmmd.";
inline constexpr std::string_view gpu_uuid_label      = "rmmd.gpu_uuid";

/// Bytes per element of rmmd.v1.DType `dtype`; nothing for DTYPE_UNSPECIFIED
/// and numbers the protocol does not define.
std::optional<std::size_t> dtype_itemsize(std::int32_t dtype) noexcept;

/// The protocol's name of `dtype` without its prefix ("FLOAT16"), or its
/// number for one it does not define.
std::string dtype_text(std::int32_t dtype);

/// Bytes from the tensor's byte_offset to the end of its last element:
/// itemsize * (1 + sum((shape[i] - 1) * strides[i])), contiguous strides
/// when it has none, 0 when a dimension is 0. Nothing when it overflows
/// 64 bits. REQUIRES: a known dtype, and strides empty or one per dimension.
std::optional<std::uint64_t> tensor_extent(tensor_entry const& tensor) noexcept;

/// A label key's problem (1 to 128 bytes of [A-Za-z0-9._/:-]), or nothing.
std::optional<std::string> label_key_problem(std::string_view key);

/// The problem of labels a creator sets (the bounds, the key rule, values
/// up to 4096 bytes of UTF-8, no "rmmd." key), or nothing.
std::optional<std::string> creator_labels_problem(std::map<std::string, std::string> const& labels);

/// The first problem of `manifest`'s tensors for a buffer of
/// `buffer_bytes` (count, names and aliases, dtypes, dimensions, strides,
/// alignment, bounds, overlaps), then of its labels, or nothing.
std::optional<std::string> manifest_problem(buffer_manifest const& manifest,
                                            std::uint64_t buffer_bytes);

/// A name, key or value as a message may quote it: in single quotes,
/// C-escaped, cut to 80 bytes.
std::string quoted_for_message(std::string_view text);

/// Whether `text` is well-formed UTF-8.
bool is_utf8(std::string_view text) noexcept;

}  // namespace rmmd::core
