#pragma once

// A parsed configuration file as the checks see it: the message, where each
// of its fields was written (TextFormat::ParseInfoTree), and the errors found
// so far, each added at the field it concerns.

#include "daemon/config/config_loader.hpp"
#include "rmmd/v1/config.pb.h"

#include <absl/strings/str_format.h>
#include <google/protobuf/text_format.h>

#include <string_view>
#include <utility>
#include <vector>

namespace rmmd::config::detail {

using info_tree = google::protobuf::TextFormat::ParseInfoTree;

/// One message of the file: its parse tree and where it starts, so an error
/// about a field that is absent can point at the message that lacks it.
struct node {
  info_tree const* tree{};
  google::protobuf::Message const* message{};
  int line{};    // 1-based; 0: unknown
  int column{};  // 1-based
};

class checked_file {
 public:
  checked_file(v1::DaemonConfig const& config,
               info_tree const& tree,
               std::vector<config_error>& errors)
      : config_(config), errors_(errors), root_{&tree, &config, 1, 1}
  {
  }

  [[nodiscard]] v1::DaemonConfig const& config() const noexcept
  {
    return config_;
  }
  /// The file's top-level message.
  [[nodiscard]] node const& root() const noexcept
  {
    return root_;
  }

  /// Location of `field` (the index-th value of a repeated one) in `n`, or
  /// of `n` itself when the file does not set it.
  ///
  /// The parser records one location per occurrence of a field name, so the
  /// values of a list (`allowed_users: ["a", "b"]`) share one: there the
  /// first occurrence of the field is the best there is.
  [[nodiscard]] std::pair<int, int> where(node const& n,
                                          std::string_view field,
                                          int index = -1) const;

  /// Adds an error at `field` of `n` (index-th value of a repeated one; -1
  /// for a singular field).
  template <typename... Args>
  void error(node const& n,
             std::string_view field,
             int index,
             absl::FormatSpec<Args...> const& format,
             Args const&... args)
  {
    auto [line, column] = where(n, field, index);
    errors_.push_back(
        config_error{.line = line, .column = column, .message = absl::StrFormat(format, args...)});
  }

  /// The node of a nested message field (index-th of a repeated one).
  [[nodiscard]] node nested(node const& parent, std::string_view field, int index = -1) const;

 private:
  v1::DaemonConfig const& config_;
  std::vector<config_error>& errors_;
  node root_;
};

}  // namespace rmmd::config::detail
