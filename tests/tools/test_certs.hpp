#pragma once

// Test support: certificates for peering tests, as scripts/make-test-certs.sh
// makes them (its header lists them): a CA; nodeA, nodeA-next (nodeA's
// name again), nodeB and nodeC signed by it; stranger, nodeA-other-ca and
// nodeB-other-ca signed by another CA; expired, valid only in 2020.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace rmmd::test {

/// Runs the script into `dir`. Throws std::runtime_error with what it said
/// when it fails or cannot be found.
void make_test_certs(std::filesystem::path const& dir);

/// A suite of peering tests: its certificates are made once, in a directory
/// of their own (certs_), before its first test, and removed after its last.
class certs_suite : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();

  static inline std::filesystem::path certs_;
};

/// A file's text ("" where it cannot be read).
std::string read_text(std::filesystem::path const& path);

}  // namespace rmmd::test
