#pragma once

// The Prometheus endpoint: GET /metrics over HTTP, served by cpp-httplib on
// threads of its own. Off unless the operator gives an address; meant for
// localhost (DESIGN.md: no TCP listener unless configured).

#include <absl/status/statusor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

namespace httplib {
class Server;
}

namespace rmmd::metrics {

struct listen_address {
  std::string host;  ///< a name or an address; IPv6 without brackets
  std::uint16_t port{};
};

/// "HOST:PORT", "[IPv6]:PORT", or ":PORT" (which means 127.0.0.1); port 0
/// picks a free port. INVALID_ARGUMENT naming what is wrong otherwise.
absl::StatusOr<listen_address> parse_listen_address(std::string_view text);

class metrics_server {
 public:
  /// Returns the exposition text for one scrape; called on a server thread.
  using scrape_function = std::function<std::string()>;

  /// Binds to `address` (see parse_listen_address) and serves on threads of
  /// its own. Throws std::invalid_argument for a malformed address and
  /// std::runtime_error when it cannot bind, naming the address.
  metrics_server(std::string_view address, scrape_function scrape);
  metrics_server(metrics_server const&)            = delete;
  metrics_server& operator=(metrics_server const&) = delete;
  /// Stops serving and joins its threads.
  ~metrics_server();

  /// The address it listens on, with the port it bound ("127.0.0.1:9400",
  /// "[::1]:9400").
  [[nodiscard]] std::string const& address() const noexcept
  {
    return address_;
  }

 private:
  std::unique_ptr<httplib::Server> server_;
  std::string address_;
  std::atomic<bool> listen_returned_{false};
  std::thread thread_;
};

}  // namespace rmmd::metrics
