#include "tests/tools/child_process.hpp"

#include <cstdlib>
#include <utility>

namespace rmmd::test {

std::filesystem::path program_path(std::string const& name)
{
  if (char const* dir = std::getenv("RMMD_BIN_DIR"); dir != nullptr && *dir != '\0') {
    return std::filesystem::path(dir) / name;
  }
  auto beside = std::filesystem::read_symlink("/proc/self/exe").parent_path() / name;
  if (std::filesystem::exists(beside)) { return beside; }
  static constexpr std::pair<char const*, char const*> in_build_tree[] = {
      {"rmmd", "daemon/rmmd"},
      {"rmmctl", "rmmctl/rmmctl"},
      {"rmmd_test_client", "tests/rmmd_test_client"},
      {"rmmd_soak_client", "tests/rmmd_soak_client"},
      {"rmmd_hello", "examples/rmmd_hello"},
      {"rmmd_share_producer", "examples/rmmd_share_producer"},
      {"rmmd_share_consumer", "examples/rmmd_share_consumer"},
      {"rmmd_manifest_reader", "examples/rmmd_manifest_reader"}};
  for (auto [program, relative] : in_build_tree) {
    if (name == program) { return std::filesystem::path(RMMD_BUILD_DIR) / relative; }
  }
  return std::filesystem::path(RMMD_BUILD_DIR) / name;
}

run_result run(std::vector<std::string> argv, std::chrono::milliseconds timeout)
{
  child_process child(std::move(argv));
  child.close_stdin();
  auto out    = child.read_all(timeout);
  auto status = child.wait(timeout);
  return {.status = status.value_or(-1), .out = std::move(out)};
}

}  // namespace rmmd::test
