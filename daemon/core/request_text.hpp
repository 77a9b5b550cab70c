#pragma once

// What a request asked for, in words, for the message of a refusal. A
// parameter type: it refers to what it was made from (a string, a literal,
// or a function that writes the words) and lives no longer than the call it
// is passed to. Made from a function, it writes the words only when a
// message needs them, so that a request served formats nothing (an
// allocation's "allocate 256 B from pool 'gpu0'" was a fifth of the
// daemon's instructions per direct pair). Not thread-safe; used under the
// core's mutex by the one call that made it.

#include <absl/functional/function_ref.h>

#include <optional>
#include <string>
#include <string_view>

namespace rmmd::core {

class request_text {
 public:
  request_text(std::string const& text) : text_(text) {}  // NOLINT(google-explicit-constructor)
  request_text(char const* text) : text_(text) {}         // NOLINT(google-explicit-constructor)
  /// Words that `write` makes when first asked for (it must outlive this).
  explicit request_text(absl::FunctionRef<std::string()> write) : write_(write) {}

  /// The words (written now, the first time, when made from a function).
  [[nodiscard]] std::string_view str() const
  {
    if (write_ && !written_) { written_ = (*write_)(); }
    return written_ ? std::string_view(*written_) : text_;
  }

 private:
  std::string_view text_;
  std::optional<absl::FunctionRef<std::string()>> write_;
  mutable std::optional<std::string> written_;
};

}  // namespace rmmd::core
