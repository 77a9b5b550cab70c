#pragma once

// What tests and benches of peering daemons (docs/operations.md, "Across
// nodes") need to set up: a free TCP port on 127.0.0.1, and
// scripts/make-test-certs.sh, which makes their certificates.

#include <filesystem>

namespace rmmd::harness {

/// A TCP port on 127.0.0.1 that was free a moment ago; 0 if none was found.
int free_loopback_port();

/// make-test-certs.sh: $RMMD_TEST_CERTS_SCRIPT, else beside this program (a
/// bundle), else in `source_dir`/scripts; empty when it is nowhere.
std::filesystem::path find_certs_script(std::filesystem::path const& source_dir);

}  // namespace rmmd::harness
