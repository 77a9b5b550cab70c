#include "daemon/restart/fd_store.hpp"

#include "daemon/log.hpp"

#include <systemd/sd-daemon.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

namespace rmmd::restart {
namespace {

bool fd_name_char_ok(char c)
{
  return c >= ' ' && c < 127 && c != ':';
}

std::string fd_name_of(std::string_view prefix, std::uint64_t fd_id, std::string_view what)
{
  std::string name = std::string(prefix) + std::to_string(fd_id) + ".";
  for (char c : what) {
    if (name.size() == max_fd_name_bytes) { break; }
    name.push_back(fd_name_char_ok(c) ? c : '_');
  }
  return name;
}

std::optional<std::uint64_t> fd_id_of(std::string_view prefix, std::string_view fd_name)
{
  if (!fd_name.starts_with(prefix)) { return std::nullopt; }
  auto rest          = fd_name.substr(prefix.size());
  std::uint64_t id   = 0;
  std::size_t digits = 0;
  for (; digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9'; ++digits) {
    auto const d = static_cast<std::uint64_t>(rest[digits] - '0');
    if (id > (std::numeric_limits<std::uint64_t>::max() - d) / 10) { return std::nullopt; }
    id = id * 10 + d;
  }
  if (digits == 0) { return std::nullopt; }
  if (digits < rest.size() && rest[digits] != '.') { return std::nullopt; }
  return id;
}

}  // namespace

std::string buffer_fd_name(std::uint64_t fd_id, std::string_view buffer_name)
{
  return fd_name_of(buffer_fd_name_prefix, fd_id, buffer_name);
}

std::optional<std::uint64_t> buffer_fd_id(std::string_view fd_name)
{
  return fd_id_of(buffer_fd_name_prefix, fd_name);
}

std::string backup_fd_name(std::uint64_t fd_id, std::string_view backup_name)
{
  return fd_name_of(backup_fd_name_prefix, fd_id, backup_name);
}

std::optional<std::uint64_t> backup_fd_id(std::string_view fd_name)
{
  return fd_id_of(backup_fd_name_prefix, fd_name);
}

std::optional<std::uint64_t> stored_fd_id(std::string_view fd_name)
{
  if (auto id = buffer_fd_id(fd_name)) { return id; }
  return backup_fd_id(fd_name);
}

bool is_valid_fd_name(std::string_view fd_name)
{
  if (fd_name.size() > max_fd_name_bytes) { return false; }
  for (char c : fd_name) {
    if (!fd_name_char_ok(c)) { return false; }
  }
  return true;
}

owned_fd& owned_fd::operator=(owned_fd&& other) noexcept
{
  if (this != &other) {
    if (fd_ >= 0) { ::close(fd_); }
    fd_ = other.release();
  }
  return *this;
}

owned_fd::~owned_fd()
{
  if (fd_ >= 0) { ::close(fd_); }
}

int owned_fd::release() noexcept
{
  return std::exchange(fd_, -1);
}

passed_fds take_passed_fds()
{
  passed_fds result;
  // The count first, without touching the environment: if the names are
  // malformed, sd_listen_fds_with_names fails after it has unset it.
  int const count = ::sd_listen_fds(0);
  if (count < 0) {
    log::warn("LISTEN_FDS is malformed (%s): taking no passed fds", std::strerror(-count));
    return result;
  }
  if (count == 0) { return result; }
  char** names    = nullptr;
  int const named = ::sd_listen_fds_with_names(1, &names);
  for (int i = 0; i < count; ++i) {
    int const fd = SD_LISTEN_FDS_START + i;
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // sd_listen_fds does so too; not on its error path
    std::string name = "unknown";
    if (named == count && names != nullptr && names[i] != nullptr) { name = names[i]; }
    if (auto id = stored_fd_id(name)) {
      result.stored.push_back(
          passed_stored_fd{.fd_id = *id, .name = std::move(name), .fd = owned_fd(fd)});
    } else {
      result.others.push_back(passed_fd{.name = std::move(name), .fd = owned_fd(fd)});
    }
  }
  if (named != count) {
    log::warn(
        "LISTEN_FDNAMES does not name the %d passed fd(s) (%s): none of them is taken as a "
        "buffer's or a backup's",
        count,
        named < 0 ? std::strerror(-named) : "a different count");
    ::unsetenv("LISTEN_FDS");
    ::unsetenv("LISTEN_PID");
    ::unsetenv("LISTEN_FDNAMES");
  }
  if (names != nullptr) {
    for (char** n = names; *n != nullptr; ++n) { std::free(*n); }
    std::free(names);
  }
  return result;
}

fd_store::fd_store()
{
  char const* socket = std::getenv("NOTIFY_SOCKET");
  available_         = socket != nullptr && socket[0] != '\0';
}

absl::Status fd_store::store(std::string_view fd_name, int fd)
{
  if (!is_valid_fd_name(fd_name)) {
    return absl::InvalidArgumentError(
        "cannot store an fd under the name '" + std::string(fd_name) +
        "': systemd takes at most 255 bytes of printable ASCII without ':'");
  }
  if (!available_) {
    say_unavailable_once();
    return absl::OkStatus();
  }
  return send("FDSTORE=1\nFDNAME=" + std::string(fd_name) + "\nFDPOLL=0", &fd, 1);
}

absl::Status fd_store::remove(std::string_view fd_name)
{
  if (!is_valid_fd_name(fd_name)) {
    return absl::InvalidArgumentError("cannot remove '" + std::string(fd_name) +
                                      "' from the fd store: not a name systemd gives an fd");
  }
  if (!available_) {
    say_unavailable_once();
    return absl::OkStatus();
  }
  return send("FDSTOREREMOVE=1\nFDNAME=" + std::string(fd_name), nullptr, 0);
}

absl::Status fd_store::send(std::string const& message, int const* fds, unsigned n_fds)
{
  int const r = ::sd_pid_notify_with_fds(0, 0, message.c_str(), fds, n_fds);
  if (r > 0) { return absl::OkStatus(); }
  auto const first_line = message.substr(0, message.find('\n'));
  if (r == 0) {
    return absl::FailedPreconditionError(first_line +
                                         ": NOTIFY_SOCKET is no longer set, nothing was sent");
  }
  return absl::UnavailableError(
      first_line + " to the service manager (NOTIFY_SOCKET) failed: " + std::strerror(-r));
}

void fd_store::say_unavailable_once()
{
  if (!said_unavailable_.exchange(true)) {
    log::info(
        "no service manager (NOTIFY_SOCKET is not set): buffers and sleep backups are not "
        "put in an fd store, and a restart of rmmd loses them");
  }
}

}  // namespace rmmd::restart
