// Manifests on the client (no daemon, no CUDA): the dtype table, a tensor's
// element count, extent and contiguity, lookup by name and alias, and the
// conversion to and from the wire's messages.

#include "client/detail/manifest_convert.hpp"

#include <rmmd/shared_buffer.hpp>

#include <gtest/gtest.h>

#include <limits>
#include <string>

namespace rmmd {
namespace {

TEST(Dtype, EveryTypeHasItsSizeAndANameThatReadsBack)
{
  struct row {
    dtype type;
    std::size_t size;
    char const* name;
  };
  for (auto [type, size, name] : {row{dtype::bool_, 1, "bool"},
                                  row{dtype::uint8, 1, "uint8"},
                                  row{dtype::int8, 1, "int8"},
                                  row{dtype::uint16, 2, "uint16"},
                                  row{dtype::int16, 2, "int16"},
                                  row{dtype::float16, 2, "float16"},
                                  row{dtype::bfloat16, 2, "bfloat16"},
                                  row{dtype::uint32, 4, "uint32"},
                                  row{dtype::int32, 4, "int32"},
                                  row{dtype::float32, 4, "float32"},
                                  row{dtype::uint64, 8, "uint64"},
                                  row{dtype::int64, 8, "int64"},
                                  row{dtype::float64, 8, "float64"},
                                  row{dtype::float8_e4m3fn, 1, "float8_e4m3fn"},
                                  row{dtype::float8_e5m2, 1, "float8_e5m2"},
                                  row{dtype::complex64, 8, "complex64"},
                                  row{dtype::complex128, 16, "complex128"}}) {
    EXPECT_EQ(itemsize(type), size) << name;
    EXPECT_EQ(to_string(type), name);
    EXPECT_EQ(dtype_from_string(name), type) << name;
  }
  EXPECT_EQ(dtype_from_string("float"), std::nullopt);
  EXPECT_EQ(dtype_from_string("DTYPE_FLOAT16"), std::nullopt);
  EXPECT_EQ(dtype_from_string(""), std::nullopt);
  // A number a newer daemon may send: no size, and a name that says so.
  auto const future = static_cast<dtype>(200);
  EXPECT_EQ(itemsize(future), 0u);
  EXPECT_EQ(to_string(future), "unknown");
}

TEST(TensorEntry, ContiguousTensorsSpanTheirElementsTimesTheItemsize)
{
  tensor_entry t{.name = "w", .type = dtype::float16, .shape = {4096, 1024}};
  EXPECT_EQ(t.element_count(), 4096u * 1024u);
  EXPECT_EQ(t.byte_extent(), 2u * 4096u * 1024u);
  EXPECT_TRUE(t.contiguous());

  tensor_entry scalar{.name = "s", .type = dtype::float64};
  EXPECT_EQ(scalar.element_count(), 1u);
  EXPECT_EQ(scalar.byte_extent(), 8u);

  tensor_entry empty{.name = "e", .type = dtype::float32, .shape = {3, 0, 5}};
  EXPECT_EQ(empty.element_count(), 0u);
  EXPECT_EQ(empty.byte_extent(), 0u);
  EXPECT_TRUE(empty.contiguous());
}

TEST(TensorEntry, StridedTensorsSpanToTheirLastElement)
{
  // A transposed 3x4 float32 matrix: shape (4, 3), strides (1, 4).
  tensor_entry t{.name = "t", .type = dtype::float32, .shape = {4, 3}, .strides = {1, 4}};
  EXPECT_EQ(t.element_count(), 12u);
  EXPECT_EQ(t.byte_extent(), 4u * (1 + 3 * 1 + 2 * 4));
  EXPECT_FALSE(t.contiguous());

  // Row-major strides written out are contiguous; a size-1 dimension's
  // stride does not matter (as PyTorch judges it).
  tensor_entry rows{.name = "r", .type = dtype::int8, .shape = {2, 1, 3}, .strides = {3, 99, 1}};
  EXPECT_TRUE(rows.contiguous());
  EXPECT_EQ(rows.byte_extent(), 6u);

  // Every other column of a 2x8 bfloat16 matrix.
  tensor_entry sliced{.name = "s", .type = dtype::bfloat16, .shape = {2, 4}, .strides = {8, 2}};
  EXPECT_FALSE(sliced.contiguous());
  EXPECT_EQ(sliced.byte_extent(), 2u * (1 + 8 + 3 * 2));

  // A broadcast (stride 0) reads one element many times.
  tensor_entry broadcast{.name = "b", .type = dtype::float32, .shape = {1000}, .strides = {0}};
  EXPECT_EQ(broadcast.byte_extent(), 4u);
}

TEST(TensorEntry, SizesPast64BitsSaturateInsteadOfWrapping)
{
  auto const max = std::numeric_limits<std::uint64_t>::max();
  tensor_entry huge{.name = "h", .type = dtype::float64, .shape = {1ULL << 40, 1ULL << 40}};
  EXPECT_EQ(huge.element_count(), max);
  EXPECT_EQ(huge.byte_extent(), max);
  tensor_entry strided{
      .name = "s", .type = dtype::float32, .shape = {1ULL << 62, 4}, .strides = {8, 1}};
  EXPECT_EQ(strided.byte_extent(), max);
}

TEST(BufferManifest, FindsTensorsByNameAndByAlias)
{
  buffer_manifest m{
      .tensors = {{.name = "wte", .type = dtype::float32, .shape = {10, 4}, .aliases = {"lm_head"}},
                  {.name = "ln.bias", .type = dtype::float32, .shape = {4}, .byte_offset = 160}},
      .labels  = {{"model", "gpt2"}}};
  ASSERT_NE(m.find("wte"), nullptr);
  EXPECT_EQ(m.find("lm_head"), m.find("wte"));
  EXPECT_EQ(m.find("ln.bias")->byte_offset, 160u);
  EXPECT_EQ(m.find("nothing"), nullptr);
  EXPECT_FALSE(m.empty());
  EXPECT_TRUE(buffer_manifest{}.empty());
  EXPECT_FALSE((buffer_manifest{.labels = {{"k", "v"}}}.empty()));
}

TEST(ManifestConversion, RoundTripsThroughTheWireMessage)
{
  buffer_manifest m{.tensors = {{.name        = "wte",
                                 .type        = dtype::bfloat16,
                                 .shape       = {50257, 768},
                                 .byte_offset = 0,
                                 .aliases     = {"lm_head.weight"}},
                                {.name        = "h.0.attn.c_attn.weight.T",
                                 .type        = dtype::float8_e4m3fn,
                                 .shape       = {2304, 768},
                                 .byte_offset = 77194752,
                                 .strides     = {1, 2304}}},
                    .labels  = {{"model", "gpt2"}, {"revision", "abc123"}, {"rank", "0"}}};
  v1::BufferManifest wire;
  detail::to_proto(m, &wire);
  ASSERT_EQ(wire.tensors_size(), 2);
  EXPECT_EQ(wire.tensors(0).dtype(), v1::DTYPE_BFLOAT16);
  EXPECT_EQ(wire.tensors(1).dtype(), v1::DTYPE_FLOAT8_E4M3FN);
  EXPECT_EQ(wire.tensors(1).strides_size(), 2);
  EXPECT_EQ(wire.tensors(0).aliases(0), "lm_head.weight");
  EXPECT_EQ(wire.labels().at("revision"), "abc123");

  auto back = detail::from_proto(wire);
  ASSERT_EQ(back.tensors.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back.tensors[i].name, m.tensors[i].name);
    EXPECT_EQ(back.tensors[i].type, m.tensors[i].type);
    EXPECT_EQ(back.tensors[i].shape, m.tensors[i].shape);
    EXPECT_EQ(back.tensors[i].byte_offset, m.tensors[i].byte_offset);
    EXPECT_EQ(back.tensors[i].strides, m.tensors[i].strides);
    EXPECT_EQ(back.tensors[i].aliases, m.tensors[i].aliases);
  }
  EXPECT_EQ(back.labels, m.labels);

  // Converting into a message that held something replaces it.
  detail::to_proto(buffer_manifest{}, &wire);
  EXPECT_EQ(wire.tensors_size(), 0);
  EXPECT_TRUE(wire.labels().empty());
}

TEST(ManifestConversion, BufferInfoCarriesLabelsTensorCountAndAccess)
{
  v1::BufferInfo wire;
  wire.set_buffer_id(7);
  wire.set_name("team/model/w0");
  wire.set_pool_name("host");
  wire.set_size(1 << 20);
  wire.set_creator_uid(1000);
  wire.set_holders(3);
  wire.set_state(v1::BUFFER_STATE_PUBLISHED);
  wire.set_allow_writers(true);
  wire.set_tensor_count(53);
  (*wire.mutable_labels())["model"] = "gpt2";
  auto info                         = detail::from_proto(wire);
  EXPECT_EQ(info.id, 7u);
  EXPECT_EQ(info.name, "team/model/w0");
  EXPECT_EQ(info.pool, "host");
  EXPECT_EQ(info.size, 1u << 20);
  EXPECT_EQ(info.creator_uid, 1000u);
  EXPECT_EQ(info.gid, std::nullopt);
  EXPECT_EQ(info.holders, 3u);
  EXPECT_TRUE(info.published);
  EXPECT_FALSE(info.persistent);
  EXPECT_TRUE(info.allow_writers);
  EXPECT_EQ(info.tensor_count, 53u);
  EXPECT_EQ(info.labels.at("model"), "gpt2");

  wire.set_gid(42);
  wire.set_state(v1::BUFFER_STATE_WRITING);
  info = detail::from_proto(wire);
  EXPECT_EQ(info.gid, 42u);
  EXPECT_FALSE(info.published);
}

}  // namespace
}  // namespace rmmd
