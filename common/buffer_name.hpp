#pragma once

// The rule for shared buffer names, in one place: the daemon checks every
// name it is given against it, and the client library checks before it asks
// (a wrong name costs no round trip). Header-only, the standard library only.

#include <cstddef>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace rmmd::names {

inline constexpr std::size_t max_buffer_name_bytes = 255;

inline constexpr std::string_view buffer_name_rule =
    "a buffer name is 1 to 255 bytes of A-Z a-z 0-9 . _ - /, in segments separated by '/', "
    "with no empty segment (no leading, trailing or doubled '/') and no \"..\"";

/// Why `name` is not a valid buffer name, or nullopt when it is one: 1 to 255
/// bytes of [A-Za-z0-9._/-], segments separated by '/', no empty segment (no
/// leading, trailing or doubled '/'), and no "..".
inline std::optional<std::string> buffer_name_problem(std::string_view name)
{
  auto because = [](std::string why) { return why + "; " + std::string(buffer_name_rule); };
  if (name.empty()) { return because("the name is empty"); }
  if (name.size() > max_buffer_name_bytes) {
    return because("the name has " + std::to_string(name.size()) + " bytes");
  }
  for (std::size_t i = 0; i < name.size(); ++i) {
    char const c  = name[i];
    bool const ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-' || c == '/';
    if (!ok) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02x", static_cast<unsigned char>(c));
      return because("byte " + std::to_string(i) + " of the name (" + hex + ") is not allowed");
    }
  }
  if (name.front() == '/') { return because("the name starts with '/'"); }
  if (name.back() == '/') { return because("the name ends with '/'"); }
  if (name.find("//") != std::string_view::npos) {
    return because("the name has an empty segment ('//')");
  }
  if (name.find("..") != std::string_view::npos) { return because("the name contains \"..\""); }
  return std::nullopt;
}

}  // namespace rmmd::names
