#include "daemon/config/config_loader.hpp"

#include "daemon/config/detail/checks.hpp"
#include "rmmd/v1/config.pb.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>

namespace rmmd::config {
namespace {

namespace pb    = google::protobuf;
using info_tree = pb::TextFormat::ParseInfoTree;

/// Collects the parser's errors, 1-based.
class error_collector final : public pb::io::ErrorCollector {
 public:
  explicit error_collector(std::vector<config_error>& errors) : errors_(errors) {}

  void AddError(int line, pb::io::ColumnNumber column, std::string const& message) override
  {
    errors_.push_back(config_error{
        .line = line < 0 ? 0 : line + 1, .column = line < 0 ? 0 : column + 1, .message = message});
  }
  void AddWarning(int, pb::io::ColumnNumber, std::string const&) override {}

 private:
  std::vector<config_error>& errors_;
};

/// Checks a parsed DaemonConfig, part by part, and builds the settings;
/// every problem is added to `errors` at the field it concerns.
daemon_settings validate(v1::DaemonConfig const& config,
                         detail::info_tree const& tree,
                         std::vector<config_error>& errors)
{
  detail::checked_file file(config, tree, errors);
  auto s = default_settings();
  detail::check_runtime(file, s);
  detail::check_access(file, s);
  detail::check_tenancy(file, s);
  detail::check_pools(file, s);
  detail::check_per_gpu_pools(file, s);
  detail::check_quotas(file, s);
  detail::check_admission(file, s);
  detail::check_timing(file, s);
  detail::check_outputs(file, s);
  detail::check_peering(file, s);
  return s;
}

}  // namespace

std::string format_error(std::filesystem::path const& file, config_error const& error)
{
  if (error.line <= 0) { return absl::StrCat(file.string(), ": ", error.message); }
  return absl::StrFormat("%s:%d:%d: %s", file.string(), error.line, error.column, error.message);
}

load_result parse_config(std::string_view text)
{
  load_result result;
  v1::DaemonConfig config;
  info_tree tree;
  error_collector collector(result.errors);
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&collector);
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(std::string(text), &config)) {
    if (result.errors.empty()) {  // the parser always says why; this is a safety net
      result.errors.push_back(config_error{.message = "not a valid rmmd.v1.DaemonConfig text"});
    }
    return result;
  }
  auto settings = validate(config, tree, result.errors);
  std::stable_sort(result.errors.begin(), result.errors.end(), [](auto const& a, auto const& b) {
    return std::tie(a.line, a.column) < std::tie(b.line, b.column);
  });
  if (result.errors.empty()) { result.settings = std::move(settings); }
  return result;
}

load_result load_config_file(std::filesystem::path const& path)
{
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    load_result result;
    result.errors.push_back(
        config_error{.message = "cannot read the configuration file: it is a directory"});
    return result;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    load_result result;
    result.errors.push_back(config_error{
        .message = absl::StrCat("cannot read the configuration file: ", std::strerror(errno))});
    return result;
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    load_result result;
    result.errors.push_back(config_error{
        .message = absl::StrCat("cannot read the configuration file: ", std::strerror(errno))});
    return result;
  }
  return parse_config(text.str());
}

}  // namespace rmmd::config
