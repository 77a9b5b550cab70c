// The configuration file's parser and validator (what `rmmd --check-config`
// and every start and reload run), with arbitrary text.
//
// Input: the file's text.
//
// Checked: a result has settings exactly when it has no errors; every error
// has a message and a position inside the text (or none, for the whole
// file), and formats; settings that pass can be summarised.

#include "daemon/config/config_loader.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size)
{
  using namespace rmmd;
  std::string_view const text(reinterpret_cast<char const*>(data), size);
  auto const result = config::parse_config(text);
  RMMD_FUZZ_CHECK(result.ok() == result.settings.has_value());
  auto const lines = 1 + std::count(text.begin(), text.end(), '\n');
  for (auto const& e : result.errors) {
    RMMD_FUZZ_CHECK(!e.message.empty());
    RMMD_FUZZ_CHECK(e.line >= 0 && e.column >= 0 && e.line <= lines);
    RMMD_FUZZ_CHECK(!config::format_error("fuzz.conf", e).empty());
  }
  if (result.settings) { RMMD_FUZZ_CHECK(!config::summary(*result.settings).empty()); }
  return 0;
}
