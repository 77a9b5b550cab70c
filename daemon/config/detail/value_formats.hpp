#pragma once

// How single values of the configuration file must be written: octal modes,
// listen addresses, GPU selectors and pool names.

#include <sys/types.h>

#include <optional>
#include <string>

namespace rmmd::config::detail {

/// An octal mode as written in the file ("0660", "750"); nullopt if it is not one.
[[nodiscard]] std::optional<mode_t> parse_mode(std::string const& text);

/// "HOST:PORT" or "[IPV6]:PORT"; an empty string if it is well formed, else why not.
[[nodiscard]] std::string check_address(std::string const& address);

/// A GPU UUID ("GPU-" and 32 hex digits in groups of 8-4-4-4-12) or a PCI bus
/// id ("0000:3b:00.0" or "3b:00.0"), as `gpu` takes them.
[[nodiscard]] bool is_gpu_selector(std::string const& text);

/// Letters, digits, '.', '_' and '-', 1 to 64 of them.
[[nodiscard]] bool valid_pool_name(std::string const& name);

}  // namespace rmmd::config::detail
