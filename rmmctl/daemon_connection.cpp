#include "rmmctl/daemon_connection.hpp"

#include "client/detail/session_impl.hpp"

#include <grpcpp/grpcpp.h>

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
/// add ("std::bad_alloc: ", "rmmd: "): rmmctl puts its own name in front.
std::string plain_message(std::exception const& e)
{
  std::string_view text = e.what();
  for (std::string_view prefix : {"std::bad_alloc: ", "rmmd: "}) {
    if (text.substr(0, prefix.size()) == prefix) { text.remove_prefix(prefix.size()); }
  }
  return std::string(text);
}

}  // namespace

ctl_error call_failed(grpc::Status const& status, std::string_view what)
{
  auto message = std::string(what) + ": " + status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::PERMISSION_DENIED:
      return ctl_error(denied, message);
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return ctl_error(not_running, message + " (the daemon is gone, stopping, or not answering)");
    default:
      return ctl_error(failed, message);
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

v1::HealthResponse daemon_connection::health()
{
  auto const path = dir_ / "rmmd.sock";
  if (!health_stub_) {
    expect_listening(path);
    health_stub_ = v1::Rmmd::NewStub(
        grpc::CreateChannel("unix:" + path.string(), grpc::InsecureChannelCredentials()));
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout_);
  v1::HealthResponse response;
  auto status = health_stub_->Health(&context, v1::HealthRequest{}, &response);
  if (!status.ok()) { throw call_failed(status, "health of the daemon at " + path.string()); }
  return response;
}

}  // namespace rmmd::ctl
