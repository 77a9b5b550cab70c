#pragma once

// Test support: certificates for peering tests, as scripts/make-test-certs.sh
// makes them (its header lists them): a CA; nodeA, nodeA-next (nodeA's
// name again), nodeB and nodeC signed by it; stranger, nodeA-other-ca and
// nodeB-other-ca signed by another CA; expired, valid only in 2020.

#include <filesystem>

namespace rmmd::test {

/// Runs the script into `dir`. Throws std::runtime_error with what it said
/// when it fails or cannot be found.
void make_test_certs(std::filesystem::path const& dir);

}  // namespace rmmd::test
