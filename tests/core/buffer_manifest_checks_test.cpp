// The manifest checks on their own: every rule of BufferManifest in
// rmmd.proto, its message naming the tensor or label, and arithmetic that
// would overflow 64 bits refused rather than wrapped.

#include "daemon/core/buffer_manifest_checks.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

namespace rmmd::core {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;

constexpr std::int32_t float16  = 6;
constexpr std::int32_t float32  = 10;
constexpr std::int32_t int64    = 12;
constexpr std::int32_t bool8    = 1;
constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();

tensor_entry tensor(std::string name,
                    std::int32_t dtype,
                    std::vector<std::uint64_t> shape,
                    std::uint64_t offset,
                    std::vector<std::uint64_t> strides = {})
{
  return tensor_entry{.name        = std::move(name),
                      .dtype       = dtype,
                      .shape       = std::move(shape),
                      .byte_offset = offset,
                      .strides     = std::move(strides)};
}

std::string problem(buffer_manifest const& m, std::uint64_t size = 1 << 20)
{
  auto p = manifest_problem(m, size);
  return p ? *p : std::string("(none)");
}

TEST(DtypeItemsize, EveryProtocolDtypeAndNoOther)
{
  EXPECT_EQ(dtype_itemsize(0), std::nullopt);  // DTYPE_UNSPECIFIED
  EXPECT_EQ(dtype_itemsize(-1), std::nullopt);
  EXPECT_EQ(dtype_itemsize(18), std::nullopt);
  EXPECT_THAT(dtype_itemsize(bool8), Optional(1u));
  EXPECT_THAT(dtype_itemsize(float16), Optional(2u));
  EXPECT_THAT(dtype_itemsize(7), Optional(2u));  // BFLOAT16
  EXPECT_THAT(dtype_itemsize(float32), Optional(4u));
  EXPECT_THAT(dtype_itemsize(int64), Optional(8u));
  EXPECT_THAT(dtype_itemsize(14), Optional(1u));   // FLOAT8_E4M3FN
  EXPECT_THAT(dtype_itemsize(16), Optional(8u));   // COMPLEX64
  EXPECT_THAT(dtype_itemsize(17), Optional(16u));  // COMPLEX128
  EXPECT_EQ(dtype_text(float16), "FLOAT16");
  EXPECT_EQ(dtype_text(99), "99");
}

TEST(TensorExtent, ContiguousStridedEmptyAndOverflowing)
{
  EXPECT_THAT(tensor_extent(tensor("a", float32, {3, 4}, 0)), Optional(48u));
  EXPECT_THAT(tensor_extent(tensor("scalar", float32, {}, 0)), Optional(4u));
  EXPECT_THAT(tensor_extent(tensor("empty", float32, {3, 0, 4}, 0)), Optional(0u));
  // A transposed 3x4 view of a 4x3 matrix reaches the same 12 elements.
  EXPECT_THAT(tensor_extent(tensor("t", float32, {3, 4}, 0, {1, 3})), Optional(48u));
  // Every other column of a 4x8 matrix: the last element is at 3*8 + 3*2.
  EXPECT_THAT(tensor_extent(tensor("s", float16, {4, 4}, 0, {8, 2})), Optional(2u * 31));
  // A broadcast (stride 0) dimension adds no bytes.
  EXPECT_THAT(tensor_extent(tensor("b", float32, {1000, 4}, 0, {0, 1})), Optional(16u));
  EXPECT_EQ(tensor_extent(tensor("big", float32, {u64_max, 2}, 0)), std::nullopt);
  EXPECT_EQ(tensor_extent(tensor("big", int64, {std::uint64_t{1} << 61}, 0)), std::nullopt);
  EXPECT_EQ(tensor_extent(tensor("big", float32, {3, 3}, 0, {u64_max, 1})), std::nullopt);
  // The largest extent that fits: 2^64 - 1 one-byte elements.
  EXPECT_THAT(tensor_extent(tensor("big", bool8, {u64_max}, 0, {1})), Optional(u64_max));
  EXPECT_EQ(tensor_extent(tensor("big", float16, {u64_max}, 0, {1})), std::nullopt);
  EXPECT_EQ(tensor_extent(tensor("big", float32, {2, 2}, 0, {u64_max / 2, u64_max / 2})),
            std::nullopt);
}

TEST(ManifestProblem, AcceptsAGoodTable)
{
  buffer_manifest m;
  m.tensors            = {tensor("embed", float16, {100, 64}, 0),
                          tensor("layer0.w", float32, {64, 64}, 12800),
                          tensor("empty", float32, {0}, 1 << 20),  // may sit at the very end
                          tensor("t", float32, {64, 64}, 12800 + 16384, {1, 64})};
  m.tensors[0].aliases = {"lm_head.weight"};
  m.labels             = {{"model", "gpt2"}, {"rank", "0"}, {"framework", "torch 2.5"}};
  EXPECT_EQ(manifest_problem(m, 1 << 20), std::nullopt);
  EXPECT_EQ(manifest_problem(buffer_manifest{}, 0), std::nullopt);
}

TEST(ManifestProblem, NamesAndAliases)
{
  buffer_manifest m;
  m.tensors = {tensor("", float32, {1}, 0)};
  EXPECT_THAT(problem(m), HasSubstr("tensor #0: its name is empty"));
  m.tensors = {tensor(std::string(1025, 'x'), float32, {1}, 0)};
  EXPECT_THAT(problem(m), HasSubstr("is 1025 bytes long; at most 1024"));
  m.tensors = {tensor(std::string(1024, 'x'), float32, {1}, 0)};
  EXPECT_EQ(problem(m), "(none)");
  m.tensors = {tensor("bad\xff", float32, {1}, 0)};
  EXPECT_THAT(problem(m), HasSubstr("is not UTF-8"));
  m.tensors = {tensor("a", float32, {1}, 0), tensor("a", float32, {1}, 4)};
  EXPECT_THAT(problem(m), HasSubstr("tensor 'a' (#1): its name 'a' is taken by tensor 'a' (#0)"));
  m.tensors            = {tensor("a", float32, {1}, 0), tensor("b", float32, {1}, 4)};
  m.tensors[1].aliases = {"a"};
  EXPECT_THAT(problem(m), HasSubstr("tensor 'b' (#1): its alias 'a' is taken by tensor 'a' (#0)"));
  m.tensors[1].aliases = {"b"};
  EXPECT_THAT(problem(m), HasSubstr("its alias 'b' is taken by itself"));
  m.tensors[1].aliases = {"c", "c"};
  EXPECT_THAT(problem(m), HasSubstr("its alias 'c' is taken by itself"));
  m.tensors[1].aliases = {""};
  EXPECT_THAT(problem(m), HasSubstr("tensor 'b' (#1): its alias '' is empty"));
  m.tensors[1].aliases = {"c"};
  EXPECT_EQ(problem(m), "(none)");
}

TEST(ManifestProblem, DtypeDimensionsStridesAlignment)
{
  buffer_manifest m;
  m.tensors = {tensor("w", 0, {1}, 0)};
  EXPECT_THAT(problem(m), HasSubstr("tensor 'w' (#0): dtype UNSPECIFIED is not one"));
  m.tensors = {tensor("w", 40, {1}, 0)};
  EXPECT_THAT(problem(m), HasSubstr("dtype 40 is not one the protocol knows"));
  m.tensors = {tensor("w", bool8, std::vector<std::uint64_t>(33, 1), 0)};
  EXPECT_THAT(problem(m), HasSubstr("tensor 'w' (#0): 33 dimensions; at most 32"));
  m.tensors = {tensor("w", bool8, std::vector<std::uint64_t>(32, 1), 0)};
  EXPECT_EQ(problem(m), "(none)");
  m.tensors = {tensor("w", float32, {2, 2}, 0, {1})};
  EXPECT_THAT(problem(m), HasSubstr("1 strides for 2 dimensions"));
  m.tensors = {tensor("w", float32, {2}, 6)};
  EXPECT_THAT(problem(m), HasSubstr("byte_offset 6 is not a multiple of its itemsize 4 (FLOAT32)"));
}

TEST(ManifestProblem, BoundsOfTheBuffer)
{
  buffer_manifest m;
  m.tensors = {tensor("w", float32, {256}, 0)};
  EXPECT_EQ(problem(m, 1024), "(none)");
  EXPECT_THAT(problem(m, 1023),
              HasSubstr("tensor 'w' (#0): its bytes [0, 1024) run past the end of the buffer "
                        "(1023 bytes)"));
  m.tensors = {tensor("w", float32, {0}, 1028)};
  EXPECT_THAT(problem(m, 1024), HasSubstr("run past the end"));
  // An offset near 2^64 whose end wraps around is past the end, not before it.
  m.tensors = {tensor("w", float32, {4}, u64_max - 3)};
  EXPECT_THAT(problem(m, 1024), HasSubstr("run past the end"));
  m.tensors = {tensor("w", float32, {u64_max}, 0)};
  EXPECT_THAT(problem(m), HasSubstr("tensor 'w' (#0): its extent"));
  EXPECT_THAT(problem(m), HasSubstr("overflows 64 bits"));
}

TEST(ManifestProblem, Overlaps)
{
  buffer_manifest m;
  m.tensors = {tensor("a", float32, {4}, 0), tensor("b", float32, {4}, 12)};
  EXPECT_THAT(
      problem(m),
      HasSubstr("tensor 'a' (#0) (bytes [0, 16)) overlaps tensor 'b' (#1) (bytes [12, 28))"));
  m.tensors = {tensor("a", float32, {4}, 0), tensor("b", float32, {4}, 16)};
  EXPECT_EQ(problem(m), "(none)");
  // A small tensor inside a large one found after a third that ends first.
  m.tensors = {tensor("big", float32, {100}, 0),
               tensor("c", float32, {1}, 4),
               tensor("inner", float32, {1}, 200)};
  EXPECT_THAT(problem(m), HasSubstr("tensor 'big' (#0) (bytes [0, 400)) overlaps tensor 'c'"));
  m.tensors = {tensor("big", float32, {100}, 0), tensor("late", float32, {1}, 396)};
  EXPECT_THAT(problem(m), HasSubstr("overlaps tensor 'late' (#1)"));
  // Strided tensors are judged by the range from first to last byte.
  m.tensors = {tensor("s", float32, {4}, 0, {2}), tensor("gap", float32, {1}, 4)};
  EXPECT_THAT(problem(m), HasSubstr("overlaps"));
  // Empty tensors hold no bytes, wherever they are.
  m.tensors = {tensor("a", float32, {4}, 0), tensor("e", float32, {0, 3}, 4)};
  EXPECT_EQ(problem(m), "(none)");
}

TEST(ManifestProblem, Labels)
{
  buffer_manifest m;
  m.labels = {{"", "x"}};
  EXPECT_THAT(problem(m), HasSubstr("label key '' is 0 bytes long; give it 1 to 128 bytes"));
  m.labels = {{std::string(129, 'k'), "x"}};
  EXPECT_THAT(problem(m), HasSubstr("is 129 bytes long"));
  m.labels = {{std::string(128, 'k'), std::string(4096, 'v')}};
  EXPECT_EQ(problem(m), "(none)");
  m.labels = {{"model name", "x"}};
  EXPECT_THAT(problem(m), HasSubstr("label key 'model name' holds ' '"));
  m.labels = {{"A-z0.9_/:-", "x"}};
  EXPECT_EQ(problem(m), "(none)");
  m.labels = {{"model", std::string(4097, 'v')}};
  EXPECT_THAT(problem(m), HasSubstr("label 'model' has a value of 4097 bytes; at most 4096"));
  m.labels = {{"model", "\xc0\xaf"}};  // an overlong '/'
  EXPECT_THAT(problem(m), HasSubstr("label 'model' has a value that is not UTF-8"));
  m.labels = {{"rmmd.gpu_uuid", "GPU-0"}};
  EXPECT_THAT(problem(m), HasSubstr("label key 'rmmd.gpu_uuid' starts with \"rmmd.\""));
  m.labels.clear();
  for (int i = 0; i < 257; ++i) { m.labels["k" + std::to_string(i)] = "v"; }
  EXPECT_THAT(problem(m), HasSubstr("257 labels; a manifest carries at most 256"));
  m.labels.erase("k0");
  EXPECT_EQ(problem(m), "(none)");
}

TEST(ManifestProblem, TooManyTensors)
{
  buffer_manifest m;
  m.tensors.resize(max_manifest_tensors + 1);
  EXPECT_THAT(problem(m), HasSubstr("1048577 tensors; a manifest carries at most 1048576"));
}

TEST(IsUtf8, WellFormedOnly)
{
  EXPECT_TRUE(is_utf8(""));
  EXPECT_TRUE(is_utf8("plain"));
  EXPECT_TRUE(is_utf8("gr\xc3\xbc\xc3\x9f"));     // grüß
  EXPECT_TRUE(is_utf8("\xe2\x82\xac"));           // €
  EXPECT_TRUE(is_utf8("\xf0\x9f\x98\x80"));       // an emoji
  EXPECT_FALSE(is_utf8("\x80"));                  // a lone continuation
  EXPECT_FALSE(is_utf8("\xc3"));                  // cut short
  EXPECT_FALSE(is_utf8("\xe2\x82"));              // cut short
  EXPECT_FALSE(is_utf8("\xed\xa0\x80"));          // a surrogate
  EXPECT_FALSE(is_utf8("\xf4\x90\x80\x80"));      // past U+10FFFF
  EXPECT_FALSE(is_utf8("\xe0\x80\xaf"));          // overlong
  EXPECT_FALSE(is_utf8("\xf8\x88\x80\x80\x80"));  // five bytes
}

}  // namespace
}  // namespace rmmd::core
