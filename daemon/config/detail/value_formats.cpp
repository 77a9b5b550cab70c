#include "daemon/config/detail/value_formats.hpp"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string_view>
#include <vector>

namespace rmmd::config::detail {

std::optional<mode_t> parse_mode(std::string const& text)
{
  if (text.size() < 3 || text.size() > 4) { return std::nullopt; }
  mode_t mode = 0;
  for (char c : text) {
    if (c < '0' || c > '7') { return std::nullopt; }
    mode = mode * 8 + static_cast<mode_t>(c - '0');
  }
  return mode;
}

std::string check_address(std::string const& address)
{
  std::string host, port;
  if (!address.empty() && address.front() == '[') {
    auto close = address.find("]:");
    if (close == std::string::npos) { return "an IPv6 address is written \"[ADDRESS]:PORT\""; }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string::npos) { return "it has no port; write \"HOST:PORT\""; }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      return "an IPv6 address is written in brackets, \"[::1]:9464\"";
    }
  }
  if (host.empty()) { return "the host is empty; write \"127.0.0.1:PORT\" for this node only"; }
  std::uint32_t number = 0;
  if (port.empty() || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &number) || number == 0 || number > 65535) {
    return absl::StrFormat("the port \"%s\" is not a number from 1 to 65535", port);
  }
  return {};
}

bool is_gpu_selector(std::string const& text)
{
  auto hex       = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
  auto groups_of = [&](std::string_view s, std::vector<std::size_t> const& sizes, char sep) {
    std::size_t at = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      for (std::size_t k = 0; k < sizes[i]; ++k, ++at) {
        if (at >= s.size() || !hex(s[at])) { return false; }
      }
      char const want = i + 2 == sizes.size() && sep == ':' ? '.' : sep;
      if (i + 1 < sizes.size()) {
        if (at >= s.size() || s[at] != want) { return false; }
        ++at;
      }
    }
    return at == s.size();
  };
  std::string_view s = text;
  if (s.size() > 4 && (s.starts_with("GPU-") || s.starts_with("gpu-"))) {
    return groups_of(s.substr(4), {8, 4, 4, 4, 12}, '-');
  }
  return groups_of(s, {4, 2, 2, 1}, ':') || groups_of(s, {8, 2, 2, 1}, ':') ||
         groups_of(s, {2, 2, 1}, ':');
}

bool valid_pool_name(std::string const& name)
{
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
  });
}

}  // namespace rmmd::config::detail
