// The integration suites are the host backend's, wherever they run: their
// daemons start with --backend host unless a test names a backend or a
// config file (tests/tools/daemon_process.hpp, set_default_backend). The
// CUDA pools are the GPU suites' (tests/gpu/).

#include "tests/tools/daemon_process.hpp"

namespace {

[[maybe_unused]] bool const host_backend_by_default = [] {
  rmmd::test::set_default_backend("host");
  return true;
}();

}  // namespace
