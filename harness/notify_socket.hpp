#pragma once

// The receiving end of sd_notify: a datagram socket like systemd's
// NOTIFY_SOCKET, owned by whoever starts the daemon, so that it waits for
// what the daemon says (READY=1, RELOADING=1, STOPPING=1) instead of guessing.

#include "harness/child_process.hpp"

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace rmmd::harness {

class notify_socket {
 public:
  /// Binds a datagram socket at `path`; throws std::system_error.
  explicit notify_socket(std::filesystem::path path);
  notify_socket(notify_socket const&)            = delete;
  notify_socket& operator=(notify_socket const&) = delete;
  /// Closes the socket (the file stays where it was bound).
  ~notify_socket();

  /// "NOTIFY_SOCKET=<path>", for the daemon's environment.
  [[nodiscard]] std::string env() const;

  /// The next message holding `text`; nullopt at the deadline, or once
  /// `sender` has exited and sent nothing more (checked every 100 ms).
  std::optional<std::string> wait_for(std::string_view text,
                                      child_process& sender,
                                      steady::time_point deadline);

 private:
  std::filesystem::path path_;
  int fd_{-1};
};

}  // namespace rmmd::harness
