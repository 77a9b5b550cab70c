#pragma once

// Test support: certificates for peering tests, made with the openssl CLI
// (OpenSSL 3.0): a CA; nodeA, nodeB and nodeC signed by it (CN=rmmd-nodeX,
// SAN DNS:localhost and IP:127.0.0.1); stranger signed by another CA; and
// expired, signed by the CA but valid only in 2020. Each X as X.pem and X.key.

#include <filesystem>

namespace rmmd::test {

/// Writes them into `dir` (which must exist). Throws std::runtime_error
/// naming the openssl command that failed.
void make_test_certs(std::filesystem::path const& dir);

}  // namespace rmmd::test
