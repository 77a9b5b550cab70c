#include "client/detail/session_reader.hpp"

#include <rmm/error.hpp>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>

namespace rmmd::detail {
namespace {

thread_local bool reader_thread = false;

}  // namespace

bool session_reader::on_reader_thread() noexcept
{
  return reader_thread;
}

void session_reader::start()
{
  std::lock_guard lock(start_mutex_);
  if (thread_.joinable()) { return; }
  int const fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) {
    throw rmm::bad_alloc(std::string("rmmd: eventfd for the session's reader: ") +
                         std::strerror(errno));
  }
  wake_fd_.store(fd);
  thread_ = std::jthread([this](std::stop_token stop) { run(std::move(stop)); });
}

void session_reader::stop() noexcept
{
  std::lock_guard lock(start_mutex_);
  if (thread_.joinable()) {
    thread_.request_stop();
    ::eventfd_write(wake_fd_.load(), 1);
    thread_.join();
  }
  if (int fd = wake_fd_.exchange(-1); fd >= 0) { ::close(fd); }
}

void session_reader::wait_a_while(std::chrono::steady_clock::duration wait) const noexcept
{
  auto const ms = std::max<std::int64_t>(
      1, std::chrono::duration_cast<std::chrono::milliseconds>(wait).count());
  pollfd p{.fd = wake_fd_.load(), .events = POLLIN, .revents = 0};
  if (p.fd >= 0) {
    ::poll(&p, 1, static_cast<int>(ms));
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
}

void session_reader::run(std::stop_token stop) noexcept
{
  reader_thread = true;
  while (!stop.stop_requested()) {
    auto const generation = listener_.generation();
    std::array<pollfd, 2> watched{
        pollfd{.fd = listener_.socket_fd(), .events = POLLIN, .revents = 0},
        pollfd{.fd = wake_fd_.load(), .events = POLLIN, .revents = 0}};
    if (::poll(watched.data(), watched.size(), -1) < 0) {
      if (errno == EINTR) { continue; }
      return;
    }
    if (watched[1].revents != 0) { return; }
    // The daemon is gone: reconnect now (so that a keeper's reports and
    // reclaims go on), or the next call says so.
    if ((watched[0].revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) {
      if (!stop.stop_requested() && listener_.daemon_gone(generation)) { continue; }
      return;
    }
    if ((watched[0].revents & POLLIN) != 0) { listener_.readable(); }
  }
}

}  // namespace rmmd::detail
