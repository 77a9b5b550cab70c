#include "daemon/library_logs.hpp"

#include <absl/strings/ascii.h>
#include <google/protobuf/stubs/logging.h>
#include <grpc/support/log.h>

#include <cstdlib>
#include <string>

namespace rmmd::log {
namespace {

// A library says little on its own; a burst of ten, then one a second.
//
// Its errors are written as warnings: what a library reports on its own is
// mostly about input it was given (a hello whose name is not UTF-8, a
// malformed HTTP/2 frame), which the daemon refuses and reports in its own
// words; the daemon's own failures are its error lines.
rate_limit protobuf_lines{"messages of the protobuf library", 1.0, 10};
rate_limit grpc_lines{"messages of the gRPC library", 1.0, 10};

/// "wire_format_lite.cc", not the build machine's path.
std::string_view base_name(char const* file)
{
  std::string_view f = file != nullptr ? file : "?";
  auto slash         = f.rfind('/');
  return slash == std::string_view::npos ? f : f.substr(slash + 1);
}

void protobuf_handler(google::protobuf::LogLevel severity,
                      char const* file,
                      int line,
                      std::string const& text)
{
  std::string message(absl::StripTrailingAsciiWhitespace(text));
  if (severity == google::protobuf::LOGLEVEL_FATAL) {
    // protobuf aborts next: this line says why, whatever the budget.
    write_line(level::error,
               absl::StrFormat("protobuf (%s:%d): %s", base_name(file), line, message));
    return;
  }
  auto const l = severity == google::protobuf::LOGLEVEL_INFO ? level::info : level::warning;
  limited(protobuf_lines, l, "protobuf (%s:%d): %s", base_name(file), line, message);
}

void grpc_handler(gpr_log_func_args* args)
{
  std::string const message(
      absl::StripTrailingAsciiWhitespace(args->message != nullptr ? args->message : ""));
  if (message.rfind("assertion failed", 0) == 0) {
    // GPR_ASSERT aborts next: this line says why, whatever the budget.
    write_line(level::error,
               absl::StrFormat("grpc (%s:%d): %s", base_name(args->file), args->line, message));
    return;
  }
  auto const l = args->severity == GPR_LOG_SEVERITY_DEBUG  ? level::debug
                 : args->severity == GPR_LOG_SEVERITY_INFO ? level::info
                                                           : level::warning;
  limited(grpc_lines, l, "grpc (%s:%d): %s", base_name(args->file), args->line, message);
}

}  // namespace

void route_library_logs()
{
  google::protobuf::SetLogHandler(&protobuf_handler);
  gpr_set_log_function(&grpc_handler);
}

void set_library_log_level(level daemon_level)
{
  if (char const* v = std::getenv("GRPC_VERBOSITY"); v != nullptr && *v != '\0') { return; }
  gpr_set_log_verbosity(daemon_level == level::debug ? GPR_LOG_SEVERITY_INFO
                                                     : GPR_LOG_SEVERITY_ERROR);
}

}  // namespace rmmd::log
