// The manifest checks (daemon/core/buffer_manifest_checks.hpp), driven with
// what a creator could send in a SetBufferManifest: any bytes that parse as
// a BufferManifest, through the wire layer's conversion, for a buffer of any
// size.
//
// Input: 8 bytes, little-endian, the buffer's size; the rest, one
// rmmd.v1.BufferManifest as protobuf serialises it.
//
// Checked: the checks end (no crash, no overflow that UBSan sees); and a
// manifest they accept keeps the rules they promise: every tensor has a known
// dtype, an aligned offset, an extent that fits in 64 bits and lies inside
// the buffer, unique names and aliases, and (for small tables, by brute
// force) no two tensors share a byte.

#include "daemon/core/buffer_manifest_checks.hpp"
#include "daemon/wire/proto_convert.hpp"
#include "rmmd/v1/rmmd.pb.h"
#include "tests/fuzz/fuzz_input.hpp"

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size)
{
  using namespace rmmd;
  if (size < 8) { return 0; }
  std::uint64_t buffer_bytes = 0;
  for (int i = 7; i >= 0; --i) { buffer_bytes = (buffer_bytes << 8) | data[i]; }
  v1::BufferManifest message;
  if (!message.ParseFromArray(data + 8, static_cast<int>(size - 8))) { return 0; }
  auto const manifest = wire::from_proto(message);
  if (core::manifest_problem(manifest, buffer_bytes)) { return 0; }

  std::set<std::string> names;
  for (auto const& t : manifest.tensors) {
    auto itemsize = core::dtype_itemsize(t.dtype);
    RMMD_FUZZ_CHECK(itemsize.has_value());
    RMMD_FUZZ_CHECK(t.byte_offset % *itemsize == 0);
    auto extent = core::tensor_extent(t);
    RMMD_FUZZ_CHECK(extent.has_value());
    RMMD_FUZZ_CHECK(t.byte_offset <= buffer_bytes && *extent <= buffer_bytes - t.byte_offset);
    RMMD_FUZZ_CHECK(names.insert(t.name).second);
    for (auto const& a : t.aliases) { RMMD_FUZZ_CHECK(names.insert(a).second); }
  }
  if (manifest.tensors.size() <= 64) {
    for (std::size_t i = 0; i < manifest.tensors.size(); ++i) {
      for (std::size_t j = i + 1; j < manifest.tensors.size(); ++j) {
        auto const& a = manifest.tensors[i];
        auto const& b = manifest.tensors[j];
        auto const ea = *core::tensor_extent(a);
        auto const eb = *core::tensor_extent(b);
        if (ea == 0 || eb == 0) { continue; }
        RMMD_FUZZ_CHECK(a.byte_offset + ea <= b.byte_offset || b.byte_offset + eb <= a.byte_offset);
      }
    }
  }
  for (auto const& [key, value] : manifest.labels) {
    RMMD_FUZZ_CHECK(!core::label_key_problem(key));
    RMMD_FUZZ_CHECK(!key.starts_with(core::daemon_label_prefix));
  }
  return 0;
}
