#pragma once

// What the client library says on stderr, one line per write(2): a line
// formatted in pieces by fprintf on the unbuffered stderr can be cut by
// another thread's output (a program's own stdout on the same pipe, say),
// and a reader of that pipe then finds neither line whole.

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <string>

namespace rmmd::detail {

/// printf's `format` and arguments, written to stderr with one write(2).
/// Never throws; a line it cannot format is not written.
[[gnu::format(printf, 1, 2)]] inline void stderr_line(char const* format, ...) noexcept
{
  std::va_list args;
  va_start(args, format);
  std::va_list again;
  va_copy(again, args);
  int const length = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  if (length > 0) {
    try {
      std::string text(static_cast<std::size_t>(length) + 1, '\0');
      std::vsnprintf(text.data(), text.size(), format, again);
      text.pop_back();  // the terminating NUL
      std::size_t done = 0;
      while (done < text.size()) {
        auto const n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
        if (n <= 0) { break; }
        done += static_cast<std::size_t>(n);
      }
    } catch (...) {  // out of memory: the line is lost
    }
  }
  va_end(again);
}

}  // namespace rmmd::detail
