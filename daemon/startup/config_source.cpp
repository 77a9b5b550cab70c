#include "daemon/startup/config_source.hpp"

#include "daemon/log.hpp"

#include <cstdio>
#include <system_error>

namespace rmmd::startup {

config::load_result load_settings(config_source const& source, bool* present)
{
  std::error_code ec;
  bool const exists = std::filesystem::exists(source.path, ec);
  if (present != nullptr) { *present = exists; }
  if (!exists && !source.explicit_path) {
    return config::load_result{.settings = config::default_settings(), .errors = {}};
  }
  return config::load_config_file(source.path);
}

int check_config(config_source const& source)
{
  bool present = false;
  auto result  = load_settings(source, &present);
  if (!result.ok()) {
    for (auto const& e : result.errors) {
      std::fprintf(stderr, "%s\n", config::format_error(source.path, e).c_str());
    }
    std::fprintf(stderr,
                 "%s: %zu error(s); rmmd would not start with this file\n",
                 source.path.c_str(),
                 result.errors.size());
    return 1;
  }
  if (present) {
    std::printf("%s: OK\n", source.path.c_str());
  } else {
    std::printf("%s: no such file; rmmd runs with the built-in defaults\n", source.path.c_str());
  }
  std::printf("%s", config::summary(*result.settings).c_str());
  return 0;
}

std::optional<config::daemon_settings> load_for_start(config_source const& source)
{
  auto loaded = load_settings(source);
  if (loaded.ok()) { return std::move(loaded.settings); }
  for (auto const& e : loaded.errors) { log::error("%s", config::format_error(source.path, e)); }
  log::error(
      "%s has errors (listed above); not starting. `rmmd --check-config %s` "
      "checks it",
      source.path.string(),
      source.path.string());
  return std::nullopt;
}

}  // namespace rmmd::startup
