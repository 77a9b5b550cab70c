#pragma once

// The daemon's version, which Health, the peer service, the metrics and
// `rmmd --version` report. Here, not in an adapter, so that every part of
// the daemon may name it.

#include <string_view>

namespace rmmd {

/// The daemon's version ("0.1.0"), from the CMake project.
std::string_view daemon_version() noexcept;

}  // namespace rmmd
