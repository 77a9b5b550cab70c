#include "tests/tools/test_certs.hpp"

#include "harness/peer_setup.hpp"
#include "tests/tools/child_process.hpp"

#include <stdlib.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

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

void certs_suite::SetUpTestSuite()
{
  char dir[] = "/tmp/rmmd-certs-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  certs_ = dir;
  make_test_certs(certs_);
}

void certs_suite::TearDownTestSuite()
{
  std::error_code ec;
  std::filesystem::remove_all(certs_, ec);
}

std::string read_text(std::filesystem::path const& path)
{
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace rmmd::test
