#include "rmmctl/daemon_connection.hpp"

#include "rmmctl/views.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace rmmd::ctl {
namespace {

constexpr char const* how_to_start =
    "is rmmd running? (`systemctl status rmmd`); if it uses another runtime directory, pass "
    "--runtime-dir or set RMMD_RUNTIME_DIR";

/// Throws ctl_error unless something accepts stream connections at `path`,
/// saying precisely what is wrong.
void expect_listening(std::filesystem::path const& path)
{
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.native().size() >= sizeof(addr.sun_path)) {
    throw ctl_error(usage, "the socket path " + path.string() + " is too long for a Unix socket");
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) { throw ctl_error(failed, std::string("socket: ") + std::strerror(errno)); }
  int const rc  = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int const err = errno;
  ::close(fd);
  if (rc == 0) { return; }
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      throw ctl_error(
          not_running,
          "rmmd is not running: there is no socket at " + path.string() + "; " + how_to_start);
    case ECONNREFUSED:
      throw ctl_error(not_running,
                      "rmmd is not running: nothing accepts connections at " + path.string() +
                          " (connection refused: a socket left by an rmmd that stopped?); " +
                          how_to_start);
    case EACCES:
    case EPERM:
      throw ctl_error(denied,
                      "permission denied connecting to " + path.string() + ": uid " +
                          std::to_string(::getuid()) +
                          " may not use this daemon's sockets; ask the operator to add you to "
                          "the `rmmd` group (then log in again), or run as root");
    default:
      throw ctl_error(
          not_running,
          "cannot connect to " + path.string() + ": " + std::strerror(err) + "; " + how_to_start);
  }
}

/// The client library's message without the prefixes its exception types
/// add ("std::bad_alloc: out_of_memory: ", "rmmd: "): rmmctl puts its own
/// name in front.
std::string plain_message(std::exception const& e)
{
  std::string_view text = e.what();
  for (std::string_view prefix : {"std::bad_alloc: ", "out_of_memory: ", "rmmd: "}) {
    if (text.substr(0, prefix.size()) == prefix) { text.remove_prefix(prefix.size()); }
  }
  return std::string(text);
}

}  // namespace

ctl_error call_failed(std::string_view what)
{
  auto const prefix = what.empty() ? std::string() : std::string(what) + ": ";
  try {
    throw;
  } catch (ctl_error const& e) {
    return e;
  } catch (rmmd::permission_error const& e) {
    return ctl_error(denied, prefix + plain_message(e));
  } catch (rmmd::session_error const& e) {
    return ctl_error(not_running, prefix + plain_message(e));
  } catch (std::exception const& e) {
    return ctl_error(failed, prefix + plain_message(e));
  }
}

daemon_connection::daemon_connection(std::filesystem::path runtime_dir,
                                     std::chrono::milliseconds timeout)
    : dir_(std::move(runtime_dir)), timeout_(timeout)
{
}

rmmd::session& daemon_connection::session()
{
  if (session_) { return *session_; }
  try {
    session_.emplace(rmmd::session::options{
        .runtime_dir = dir_, .client_name = "rmmctl", .call_timeout = timeout_});
  } catch (rmmd::permission_error const& e) {
    throw ctl_error(denied, plain_message(e));
  } catch (rmmd::session_error const& e) {
    throw ctl_error(not_running, plain_message(e));
  } catch (std::exception const& e) {
    throw ctl_error(failed, plain_message(e));
  }
  return *session_;
}

rmmd::admin daemon_connection::admin()
{
  return rmmd::admin(session());
}

v1::HealthResponse daemon_connection::health()
{
  auto const path = dir_ / "rmmd.sock";
  expect_listening(path);
  // The library's message names the call and the socket.
  return parse_json<v1::HealthResponse>(
      ask("", [&] { return rmmd::admin::health_json(dir_, timeout_); }));
}

}  // namespace rmmd::ctl
