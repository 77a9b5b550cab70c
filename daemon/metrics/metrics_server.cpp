#include "daemon/metrics/metrics_server.hpp"

#include "daemon/metrics/prometheus_text.hpp"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <httplib.h>

#include <sys/socket.h>

#include <stdexcept>

namespace rmmd::metrics {
namespace {

/// Scrapes are rare and cheap: two threads are plenty (httplib's default is
/// one per core, at least eight).
constexpr std::size_t server_threads = 2;

}  // namespace

absl::StatusOr<listen_address> parse_listen_address(std::string_view text)
{
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "metrics address '%s': %s; expected HOST:PORT, e.g. 127.0.0.1:9400, [::1]:9400 or :9400",
        text,
        why));
  };
  auto const colon = text.rfind(':');
  if (colon == std::string_view::npos) { return bad("no ':PORT'"); }
  std::string host(text.substr(0, colon));
  auto const port_text = text.substr(colon + 1);
  if (!host.empty() && host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') { return bad("an IPv6 address needs [ and ]"); }
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    return bad("an IPv6 address must be written in brackets");
  }
  if (host.empty()) { host = "127.0.0.1"; }
  std::uint32_t port{};
  if (port_text.empty() ||
      !absl::SimpleAtoi(absl::string_view(port_text.data(), port_text.size()), &port) ||
      port > 65535) {
    return bad("the port must be a number from 0 to 65535");
  }
  return listen_address{.host = std::move(host), .port = static_cast<std::uint16_t>(port)};
}

metrics_server::metrics_server(std::string_view address, scrape_function scrape)
    : server_(std::make_unique<httplib::Server>())
{
  auto parsed = parse_listen_address(address);
  if (!parsed.ok()) { throw std::invalid_argument(std::string(parsed.status().message())); }
  server_->new_task_queue = [] { return new httplib::ThreadPool(server_threads); };
  // httplib's default also sets SO_REUSEPORT, which lets a second daemon bind
  // the same port and take half the scrapes: keep only SO_REUSEADDR (a
  // restart need not wait for TIME_WAIT).
  server_->set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server_->Get("/metrics",
               [scrape = std::move(scrape)](httplib::Request const&, httplib::Response& response) {
                 response.set_content(scrape(), std::string(prometheus_content_type));
               });
  server_->set_error_handler([](httplib::Request const& request, httplib::Response& response) {
    if (response.status == 404) {
      response.set_content(
          absl::StrCat("rmmd: no ", request.path, " here; metrics are at /metrics\n"),
          "text/plain; charset=utf-8");
    }
  });
  int port = parsed->port;
  if (port == 0) {
    port = server_->bind_to_any_port(parsed->host);
  } else if (!server_->bind_to_port(parsed->host, port)) {
    port = -1;
  }
  if (port < 0) {
    throw std::runtime_error(absl::StrFormat(
        "cannot listen for metrics on %s (address in use, or not an address of this host?)",
        address));
  }
  auto const& host = parsed->host;
  address_ = absl::StrCat(host.find(':') == std::string::npos ? host : "[" + host + "]", ":", port);
  thread_  = std::thread([this] {
    server_->listen_after_bind();
    listen_returned_ = true;
  });
}

metrics_server::~metrics_server()
{
  // httplib's stop() does nothing until the server thread is in its accept
  // loop: wait for that (it starts at once), unless the loop already ended.
  while (!server_->is_running() && !listen_returned_) { std::this_thread::yield(); }
  server_->stop();
  thread_.join();
}

}  // namespace rmmd::metrics
