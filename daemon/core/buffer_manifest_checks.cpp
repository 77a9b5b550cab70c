#include "daemon/core/buffer_manifest_checks.hpp"

#include <absl/strings/escaping.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <array>
#include <unordered_map>
#include <vector>

namespace rmmd::core {
namespace {

struct dtype_row {
  std::string_view name;
  std::size_t itemsize;
};

// Indexed by rmmd.v1.DType's number; 0 is DTYPE_UNSPECIFIED.
constexpr std::array<dtype_row, 18> dtypes{{{"UNSPECIFIED", 0},
                                            {"BOOL", 1},
                                            {"UINT8", 1},
                                            {"INT8", 1},
                                            {"UINT16", 2},
                                            {"INT16", 2},
                                            {"FLOAT16", 2},
                                            {"BFLOAT16", 2},
                                            {"UINT32", 4},
                                            {"INT32", 4},
                                            {"FLOAT32", 4},
                                            {"UINT64", 8},
                                            {"INT64", 8},
                                            {"FLOAT64", 8},
                                            {"FLOAT8_E4M3FN", 1},
                                            {"FLOAT8_E5M2", 1},
                                            {"COMPLEX64", 8},
                                            {"COMPLEX128", 16}}};

std::string shown(std::string_view text)
{
  return quoted_for_message(text);
}

std::string tensor_text(tensor_entry const& t, std::size_t index)
{
  return absl::StrFormat("tensor %s (#%d)", shown(t.name), index);
}

std::optional<std::string> name_problem(std::string_view name)
{
  if (name.empty()) { return "is empty; give it a name of 1 to 1024 bytes"; }
  if (name.size() > max_tensor_name_bytes) {
    return absl::StrFormat("is %d bytes long; at most %d", name.size(), max_tensor_name_bytes);
  }
  if (!is_utf8(name)) { return std::string("is not UTF-8"); }
  return std::nullopt;
}

/// The problems of one tensor on its own; its extent on success.
std::optional<std::string> tensor_problem(tensor_entry const& t,
                                          std::size_t index,
                                          std::uint64_t buffer_bytes,
                                          std::uint64_t& extent)
{
  auto const what = tensor_text(t, index);
  auto itemsize   = dtype_itemsize(t.dtype);
  if (!itemsize) {
    return absl::StrFormat(
        "%s: dtype %s is not one the protocol knows (DTYPE_UNSPECIFIED is "
        "refused); name one of rmmd.v1.DType",
        what,
        dtype_text(t.dtype));
  }
  if (t.shape.size() > max_tensor_dims) {
    return absl::StrFormat("%s: %d dimensions; at most %d", what, t.shape.size(), max_tensor_dims);
  }
  if (!t.strides.empty() && t.strides.size() != t.shape.size()) {
    return absl::StrFormat(
        "%s: %d strides for %d dimensions; give one stride per dimension, or "
        "none for a contiguous tensor",
        what,
        t.strides.size(),
        t.shape.size());
  }
  if (t.byte_offset % *itemsize != 0) {
    return absl::StrFormat("%s: byte_offset %d is not a multiple of its itemsize %d (%s)",
                           what,
                           t.byte_offset,
                           *itemsize,
                           dtype_text(t.dtype));
  }
  auto size = tensor_extent(t);
  if (!size) {
    return absl::StrFormat(
        "%s: its extent (itemsize times the elements its shape and strides "
        "reach) overflows 64 bits",
        what);
  }
  std::uint64_t end = 0;
  if (__builtin_add_overflow(t.byte_offset, *size, &end) || end > buffer_bytes) {
    return absl::StrFormat("%s: its bytes [%d, %d%s) run past the end of the buffer (%d bytes)",
                           what,
                           t.byte_offset,
                           end < t.byte_offset ? t.byte_offset : end,
                           end < t.byte_offset ? absl::StrFormat(" + %d", *size) : std::string(),
                           buffer_bytes);
  }
  extent = *size;
  return std::nullopt;
}

}  // namespace

std::string quoted_for_message(std::string_view text)
{
  auto cut = text.substr(0, 80);
  return absl::StrCat("'",
                      absl::CHexEscape(absl::string_view(cut.data(), cut.size())),
                      text.size() > cut.size() ? "...'" : "'");
}

std::optional<std::size_t> dtype_itemsize(std::int32_t dtype) noexcept
{
  if (dtype <= 0 || static_cast<std::size_t>(dtype) >= dtypes.size()) { return std::nullopt; }
  return dtypes[static_cast<std::size_t>(dtype)].itemsize;
}

std::string dtype_text(std::int32_t dtype)
{
  if (dtype < 0 || static_cast<std::size_t>(dtype) >= dtypes.size()) { return absl::StrCat(dtype); }
  return std::string(dtypes[static_cast<std::size_t>(dtype)].name);
}

std::optional<std::uint64_t> tensor_extent(tensor_entry const& tensor) noexcept
{
  auto itemsize = dtype_itemsize(tensor.dtype);
  if (!itemsize) { return std::nullopt; }
  auto const& shape = tensor.shape;
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) { return 0; }
  // The farthest element's index: sum((shape[i] - 1) * stride[i]), with
  // row-major strides where none are given (then it is product(shape) - 1).
  std::uint64_t last = 0;
  if (tensor.strides.empty()) {
    std::uint64_t elements = 1;
    for (auto dim : shape) {
      if (__builtin_mul_overflow(elements, dim, &elements)) { return std::nullopt; }
    }
    last = elements - 1;
  } else {
    for (std::size_t i = 0; i < shape.size(); ++i) {
      std::uint64_t step = 0;
      if (__builtin_mul_overflow(shape[i] - 1, tensor.strides[i], &step) ||
          __builtin_add_overflow(last, step, &last)) {
        return std::nullopt;
      }
    }
  }
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
  if (__builtin_add_overflow(last, 1, &count) ||
      __builtin_mul_overflow(count, static_cast<std::uint64_t>(*itemsize), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

bool is_utf8(std::string_view text) noexcept
{
  std::size_t i = 0;
  while (i < text.size()) {
    auto const c       = static_cast<unsigned char>(text[i]);
    std::size_t more   = 0;
    std::uint32_t code = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xe0) == 0xc0) {
      more = 1;
      code = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      more = 2;
      code = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      more = 3;
      code = c & 0x07;
    } else {
      return false;
    }
    if (text.size() - i <= more) { return false; }
    for (std::size_t k = 1; k <= more; ++k) {
      auto const next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) { return false; }
      code = (code << 6) | (next & 0x3f);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
    static constexpr std::uint32_t least[] = {0, 0x80, 0x800, 0x10000};
    if (code < least[more] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
      return false;
    }
    i += more + 1;
  }
  return true;
}

std::optional<std::string> label_key_problem(std::string_view key)
{
  if (key.empty() || key.size() > max_label_key_bytes) {
    return absl::StrFormat("label key %s is %d bytes long; give it 1 to %d bytes",
                           shown(key),
                           key.size(),
                           max_label_key_bytes);
  }
  for (char c : key) {
    bool const ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '/' || c == ':' || c == '-';
    if (!ok) {
      return absl::StrFormat(
          "label key %s holds %s; keys are made of [A-Za-z0-9._/:-]", shown(key), shown({&c, 1}));
    }
  }
  return std::nullopt;
}

std::optional<std::string> creator_labels_problem(std::map<std::string, std::string> const& labels)
{
  if (labels.size() > max_manifest_labels) {
    return absl::StrFormat(
        "%d labels; a manifest carries at most %d", labels.size(), max_manifest_labels);
  }
  for (auto const& [key, value] : labels) {
    if (auto problem = label_key_problem(key)) { return problem; }
    if (key.starts_with(daemon_label_prefix)) {
      return absl::StrFormat(
          "label key %s starts with \"%s\", which the daemon keeps for the "
          "labels it adds; choose another key",
          shown(key),
          daemon_label_prefix);
    }
    if (value.size() > max_label_value_bytes) {
      return absl::StrFormat("label %s has a value of %d bytes; at most %d",
                             shown(key),
                             value.size(),
                             max_label_value_bytes);
    }
    if (!is_utf8(value)) {
      return absl::StrFormat("label %s has a value that is not UTF-8", shown(key));
    }
  }
  return std::nullopt;
}

std::optional<std::string> manifest_problem(buffer_manifest const& manifest,
                                            std::uint64_t buffer_bytes)
{
  auto const& tensors = manifest.tensors;
  if (tensors.size() > max_manifest_tensors) {
    return absl::StrFormat(
        "%d tensors; a manifest carries at most %d", tensors.size(), max_manifest_tensors);
  }
  // Every name and alias, to the tensor that carries it.
  std::unordered_map<std::string_view, std::size_t> names;
  names.reserve(tensors.size());
  struct range {
    std::uint64_t begin;
    std::uint64_t end;
    std::size_t tensor;
  };
  std::vector<range> ranges;
  ranges.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    auto const& t   = tensors[i];
    auto const what = tensor_text(t, i);
    if (auto problem = name_problem(t.name)) {
      return absl::StrFormat("tensor #%d: its name %s", i, *problem);
    }
    auto unique = [&](std::string_view name, std::string_view as) -> std::optional<std::string> {
      auto [it, fresh] = names.emplace(name, i);
      if (fresh) { return std::nullopt; }
      return absl::StrFormat(
          "%s: %s %s is taken by %s; names and aliases are unique in a "
          "manifest (a tied weight is one tensor with aliases)",
          what,
          as,
          shown(name),
          it->second == i ? std::string("itself") : tensor_text(tensors[it->second], it->second));
    };
    if (auto problem = unique(t.name, "its name")) { return problem; }
    for (auto const& alias : t.aliases) {
      if (auto problem = name_problem(alias)) {
        return absl::StrFormat("%s: its alias %s %s", what, shown(alias), *problem);
      }
      if (auto problem = unique(alias, "its alias")) { return problem; }
    }
    std::uint64_t extent = 0;
    if (auto problem = tensor_problem(t, i, buffer_bytes, extent)) { return problem; }
    if (extent > 0) { ranges.push_back({t.byte_offset, t.byte_offset + extent, i}); }
  }
  std::sort(ranges.begin(), ranges.end(), [](range const& a, range const& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.tensor < b.tensor;
  });
  // Sorted by start, a range overlaps another exactly when it starts before
  // the farthest end so far.
  std::size_t farthest = 0;
  for (std::size_t k = 1; k < ranges.size(); ++k) {
    auto const& before = ranges[farthest];
    auto const& r      = ranges[k];
    if (r.begin < before.end) {
      auto const& a = std::min(before.tensor, r.tensor) == before.tensor ? before : r;
      auto const& b = &a == &before ? r : before;
      return absl::StrFormat(
          "%s (bytes [%d, %d)) overlaps %s (bytes [%d, %d)); tensors may not "
          "share bytes (give a tied weight one entry with aliases)",
          tensor_text(tensors[a.tensor], a.tensor),
          a.begin,
          a.end,
          tensor_text(tensors[b.tensor], b.tensor),
          b.begin,
          b.end);
    }
    if (r.end > before.end) { farthest = k; }
  }
  return creator_labels_problem(manifest.labels);
}

}  // namespace rmmd::core
