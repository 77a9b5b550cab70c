// Manifests (include/rmmd/shared_buffer.hpp): the dtype table, a tensor's
// extent, and the conversions to and from the wire's messages.

#include "client/detail/manifest_convert.hpp"

#include <array>
#include <limits>

namespace rmmd {
namespace {

struct dtype_row {
  dtype type;
  std::size_t itemsize;
  std::string_view name;
};

// In enum order: row i is dtype i + 1 (and the wire's DType of that number).
constexpr std::array<dtype_row, 17> dtypes{{
    {dtype::bool_, 1, "bool"},
    {dtype::uint8, 1, "uint8"},
    {dtype::int8, 1, "int8"},
    {dtype::uint16, 2, "uint16"},
    {dtype::int16, 2, "int16"},
    {dtype::float16, 2, "float16"},
    {dtype::bfloat16, 2, "bfloat16"},
    {dtype::uint32, 4, "uint32"},
    {dtype::int32, 4, "int32"},
    {dtype::float32, 4, "float32"},
    {dtype::uint64, 8, "uint64"},
    {dtype::int64, 8, "int64"},
    {dtype::float64, 8, "float64"},
    {dtype::float8_e4m3fn, 1, "float8_e4m3fn"},
    {dtype::float8_e5m2, 1, "float8_e5m2"},
    {dtype::complex64, 8, "complex64"},
    {dtype::complex128, 16, "complex128"},
}};

constexpr bool table_in_order()
{
  for (std::size_t i = 0; i < dtypes.size(); ++i) {
    if (static_cast<std::size_t>(dtypes[i].type) != i + 1) { return false; }
  }
  return true;
}
static_assert(table_in_order());
// The public enum and the wire's share their numbers (conversion is a cast).
static_assert(static_cast<int>(dtype::bool_) == v1::DTYPE_BOOL);
static_assert(static_cast<int>(dtype::bfloat16) == v1::DTYPE_BFLOAT16);
static_assert(static_cast<int>(dtype::float8_e4m3fn) == v1::DTYPE_FLOAT8_E4M3FN);
static_assert(static_cast<int>(dtype::complex128) == v1::DTYPE_COMPLEX128);
static_assert(v1::DType_MAX == v1::DTYPE_COMPLEX128);

dtype_row const* row_of(dtype t) noexcept
{
  auto const i = static_cast<std::size_t>(t);
  return i >= 1 && i <= dtypes.size() ? &dtypes[i - 1] : nullptr;
}

constexpr auto saturated = std::numeric_limits<std::uint64_t>::max();

}  // namespace

std::size_t itemsize(dtype t) noexcept
{
  auto const* row = row_of(t);
  return row != nullptr ? row->itemsize : 0;
}

std::string_view to_string(dtype t) noexcept
{
  auto const* row = row_of(t);
  return row != nullptr ? row->name : std::string_view("unknown");
}

std::optional<dtype> dtype_from_string(std::string_view name) noexcept
{
  for (auto const& row : dtypes) {
    if (row.name == name) { return row.type; }
  }
  return std::nullopt;
}

std::uint64_t tensor_entry::element_count() const noexcept
{
  std::uint64_t n = 1;
  for (auto d : shape) {
    if (d == 0) { return 0; }
    // A count past 2^64 is no tensor any buffer holds: it saturates.
    if (__builtin_mul_overflow(n, d, &n)) { n = saturated; }
  }
  return n;
}

std::uint64_t tensor_entry::byte_extent() const noexcept
{
  std::uint64_t const size = itemsize(type);
  if (element_count() == 0) { return 0; }
  if (strides.empty()) {
    std::uint64_t bytes = 0;
    return __builtin_mul_overflow(element_count(), size, &bytes) ? saturated : bytes;
  }
  // The last element's offset, plus one: 1 + sum((shape[i] - 1) * strides[i]).
  std::uint64_t last = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    std::uint64_t const stride = i < strides.size() ? strides[i] : 0;
    std::uint64_t step         = 0;
    if (__builtin_mul_overflow(shape[i] - 1, stride, &step) ||
        __builtin_add_overflow(last, step, &last)) {
      return saturated;
    }
  }
  std::uint64_t bytes = 0;
  if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, size, &bytes)) {
    return saturated;
  }
  return bytes;
}

bool tensor_entry::contiguous() const noexcept
{
  if (strides.empty() || element_count() == 0) { return true; }
  if (strides.size() != shape.size()) { return false; }
  // Row-major, as PyTorch's is_contiguous() judges it: a dimension of one
  // element may have any stride.
  std::uint64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) { continue; }
    if (strides[i] != expected) { return false; }
    expected *= shape[i];
  }
  return true;
}

tensor_entry const* buffer_manifest::find(std::string_view name) const noexcept
{
  for (auto const& t : tensors) {
    if (t.name == name) { return &t; }
  }
  for (auto const& t : tensors) {
    for (auto const& alias : t.aliases) {
      if (alias == name) { return &t; }
    }
  }
  return nullptr;
}

namespace detail {

void to_proto(buffer_manifest const& m, v1::BufferManifest* out)
{
  out->Clear();
  out->mutable_tensors()->Reserve(static_cast<int>(m.tensors.size()));
  for (auto const& t : m.tensors) {
    auto* e = out->add_tensors();
    e->set_name(t.name);
    e->set_dtype(static_cast<v1::DType>(t.type));
    e->mutable_shape()->Add(t.shape.begin(), t.shape.end());
    e->set_byte_offset(t.byte_offset);
    e->mutable_strides()->Add(t.strides.begin(), t.strides.end());
    for (auto const& a : t.aliases) { e->add_aliases(a); }
  }
  copy_labels(m.labels, out->mutable_labels());
}

buffer_manifest from_proto(v1::BufferManifest const& m)
{
  buffer_manifest out;
  out.tensors.reserve(static_cast<std::size_t>(m.tensors_size()));
  for (auto const& e : m.tensors()) {
    out.tensors.push_back(tensor_entry{
        .name        = e.name(),
        .type        = static_cast<dtype>(e.dtype()),
        .shape       = {e.shape().begin(), e.shape().end()},
        .byte_offset = e.byte_offset(),
        .strides     = {e.strides().begin(), e.strides().end()},
        .aliases     = {e.aliases().begin(), e.aliases().end()},
    });
  }
  out.labels = labels_of(m.labels());
  return out;
}

void copy_labels(std::map<std::string, std::string, std::less<>> const& labels,
                 google::protobuf::RepeatedPtrField<v1::Label>* out)
{
  out->Reserve(out->size() + static_cast<int>(labels.size()));
  for (auto const& [key, value] : labels) {
    auto* label = out->Add();
    label->set_key(key);
    label->set_value(value);
  }
}

std::map<std::string, std::string, std::less<>> labels_of(
    google::protobuf::RepeatedPtrField<v1::Label> const& labels)
{
  std::map<std::string, std::string, std::less<>> out;
  for (auto const& label : labels) { out.try_emplace(label.key(), label.value()); }
  return out;
}

buffer_info from_proto(v1::BufferInfo const& info)
{
  buffer_info out{
      .id            = info.buffer_id(),
      .name          = info.name(),
      .pool          = info.pool_name(),
      .size          = info.size(),
      .creator_uid   = static_cast<uid_t>(info.creator_uid()),
      .gid           = std::nullopt,
      .holders       = info.holders(),
      .published     = info.state() == v1::BUFFER_STATE_PUBLISHED,
      .persistent    = info.persistent(),
      .allow_writers = info.allow_writers(),
      .labels        = labels_of(info.labels()),
      .tensor_count  = info.tensor_count(),
      .peer          = info.peer(),
  };
  if (info.has_gid()) { out.gid = static_cast<gid_t>(info.gid()); }
  return out;
}

}  // namespace detail
}  // namespace rmmd
