#include "tests/tools/test_certs.hpp"

#include "harness/peer_setup.hpp"
#include "tests/tools/child_process.hpp"

#include <stdexcept>

namespace rmmd::test {

void make_test_certs(std::filesystem::path const& dir)
{
  auto const script = harness::find_certs_script(RMMD_SOURCE_DIR);
  if (script.empty()) {
    throw std::runtime_error(
        "make-test-certs.sh is nowhere (set RMMD_TEST_CERTS_SCRIPT to scripts/make-test-certs.sh)");
  }
  auto const r = run({"/bin/bash", script.string(), dir.string()}, std::chrono::seconds(120));
  if (r.status != 0) {
    throw std::runtime_error(script.string() + " " + dir.string() + " failed (status " +
                             std::to_string(r.status) + "): " + r.out);
  }
}

}  // namespace rmmd::test
