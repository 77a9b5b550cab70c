#include "harness/service_manager.hpp"

#include <fcntl.h>
#include <linux/kcmp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

extern char** environ;

namespace rmmd::harness {
namespace {

[[noreturn]] void throw_errno(std::string const& what)
{
  throw std::system_error(errno, std::generic_category(), what);
}

/// systemd's fdname_is_valid.
bool valid_fd_name(std::string_view name)
{
  if (name.size() > 255) { return false; }
  return std::all_of(
      name.begin(), name.end(), [](char c) { return c >= ' ' && c < 127 && c != ':'; });
}

/// True if a and b are the same open file (systemd's same_fd).
bool same_open_file(int a, int b)
{
  pid_t const self = ::getpid();
  long const r     = ::syscall(SYS_kcmp, self, self, KCMP_FILE, a, b);
  if (r >= 0) { return r == 0; }
  struct stat sa {
  }, sb{};
  if (::fstat(a, &sa) != 0 || ::fstat(b, &sb) != 0) { return false; }
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino &&
         ::fcntl(a, F_GETFL) == ::fcntl(b, F_GETFL);
}

std::optional<std::string_view> field(std::string_view text, std::string_view key)
{
  std::size_t at = 0;
  while (at <= text.size()) {
    auto end  = text.find('\n', at);
    auto line = text.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
    if (line.starts_with(key) && line.size() > key.size() && line[key.size()] == '=') {
      return line.substr(key.size() + 1);
    }
    if (end == std::string_view::npos) { break; }
    at = end + 1;
  }
  return std::nullopt;
}

bool has_line(std::string_view text, std::string_view line)
{
  auto f = field(text, line.substr(0, line.find('=')));
  return f && *f == line.substr(line.find('=') + 1);
}

}  // namespace

service_manager::service_manager(service_manager_options options) : options_(std::move(options))
{
  socket_fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (socket_fd_ < 0) { throw_errno("socket"); }
  int on = 1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, options_.notify_socket.c_str(), sizeof(addr.sun_path) - 1);
  if (::setsockopt(socket_fd_, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) != 0 ||
      ::bind(socket_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int const e = errno;
    ::close(socket_fd_);
    throw std::system_error(
        e, std::generic_category(), "notify socket " + options_.notify_socket.string());
  }
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (stop_fd_ < 0) {
    ::close(socket_fd_);
    throw_errno("eventfd");
  }
  for (auto& [name, fd] : options_.sockets) {
    fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (fd < 0) { throw_errno("dup of socket " + name); }
  }
  receiver_ = std::thread([this] { receive_loop(); });
}

service_manager::~service_manager()
{
  kill_service(SIGKILL);
  std::uint64_t one = 1;
  (void)!::write(stop_fd_, &one, sizeof(one));
  receiver_.join();
  ::close(stop_fd_);
  ::close(socket_fd_);
  ::unlink(options_.notify_socket.c_str());
  clear_store();
  for (auto& [name, fd] : options_.sockets) { ::close(fd); }
}

void service_manager::start(std::vector<std::string> argv, std::vector<std::string> env)
{
  std::vector<std::pair<std::string, int>> passed;
  {
    std::lock_guard lock(mutex_);
    if (main_pid_ > 0) { throw std::logic_error("service_manager::start: the service runs"); }
    passed = options_.sockets;
    for (auto const& s : store_) { passed.emplace_back(s.name, s.fd); }
  }
  auto const n = static_cast<int>(passed.size());
  // Each fd above 3 + n first, so that placing them at 3.. in the child
  // never overwrites one not yet placed.
  std::vector<int> high;
  for (auto const& p : passed) {
    int fd = ::fcntl(p.second, F_DUPFD_CLOEXEC, 3 + n);
    if (fd < 0) {
      for (int h : high) { ::close(h); }
      throw_errno("dup of passed fd " + p.first);
    }
    high.push_back(fd);
  }
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view v(*e);
    if (v.starts_with("NOTIFY_SOCKET=") || v.starts_with("LISTEN_")) { continue; }
    environment.emplace_back(v);
  }
  for (auto& e : env) { environment.push_back(std::move(e)); }
  environment.push_back("NOTIFY_SOCKET=" + options_.notify_socket.string());
  std::string listen_pid = "LISTEN_PID=" + std::string(24, '\0');
  if (n > 0) {
    environment.push_back("LISTEN_FDS=" + std::to_string(n));
    std::string names;
    for (auto const& p : passed) { names += (names.empty() ? "" : ":") + p.first; }
    environment.push_back("LISTEN_FDNAMES=" + names);
  }
  std::vector<char*> envp;
  for (auto& e : environment) { envp.push_back(e.data()); }
  if (n > 0) { envp.push_back(listen_pid.data()); }
  envp.push_back(nullptr);
  std::vector<char*> args;
  for (auto& a : argv) { args.push_back(a.data()); }
  args.push_back(nullptr);

  pid_t const pid = ::fork();
  if (pid < 0) {
    for (int h : high) { ::close(h); }
    throw_errno("fork");
  }
  if (pid == 0) {
    // Async-signal-safe calls only from here to exec.
    char* digits = listen_pid.data() + 11;
    char tmp[24];
    int len = 0;
    for (auto p = static_cast<unsigned long>(::getpid()); p > 0 || len == 0; p /= 10) {
      tmp[len++] = static_cast<char>('0' + p % 10);
    }
    for (int i = 0; i < len; ++i) { digits[i] = tmp[len - 1 - i]; }
    digits[len] = '\0';
    for (int i = 0; i < n; ++i) {
      if (::dup2(high[static_cast<std::size_t>(i)], 3 + i) < 0) { ::_exit(127); }
    }
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  for (int h : high) { ::close(h); }
  int const pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  std::lock_guard lock(mutex_);
  main_pid_                 = pid;
  pidfd_                    = pidfd;
  first_message_of_service_ = messages_.size();
  changed_.notify_all();
}

std::optional<int> service_manager::kill_service(int signal)
{
  pid_t pid;
  {
    std::lock_guard lock(mutex_);
    pid = main_pid_;
  }
  if (pid <= 0) { return std::nullopt; }
  ::kill(pid, signal);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  std::lock_guard lock(mutex_);
  main_pid_ = -1;
  if (pidfd_ >= 0) { ::close(std::exchange(pidfd_, -1)); }
  changed_.notify_all();
  return status;
}

std::optional<int> service_manager::wait_exit(steady::time_point deadline)
{
  pid_t pid;
  int pidfd;
  {
    std::lock_guard lock(mutex_);
    pid   = main_pid_;
    pidfd = pidfd_;
  }
  if (pid <= 0) { return std::nullopt; }
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - steady::now());
  pollfd p{pidfd, POLLIN, 0};
  if (pidfd < 0 || ::poll(&p, 1, static_cast<int>(std::max<long long>(0, left.count()))) <= 0) {
    return std::nullopt;
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) { return std::nullopt; }
  std::lock_guard lock(mutex_);
  main_pid_ = -1;
  ::close(std::exchange(pidfd_, -1));
  changed_.notify_all();
  return status;
}

pid_t service_manager::main_pid() const
{
  std::lock_guard lock(mutex_);
  return main_pid_;
}

std::optional<std::string> service_manager::wait_for(std::string_view text,
                                                     steady::time_point deadline)
{
  std::unique_lock lock(mutex_);
  std::size_t seen = first_message_of_service_;
  pid_t const pid  = main_pid_;
  while (true) {
    for (; seen < messages_.size(); ++seen) {
      auto const& m = messages_[seen];
      if (m.sender == pid && m.text.find(text) != std::string::npos) { return m.text; }
    }
    if (main_pid_ != pid || pid <= 0 || steady::now() >= deadline) { return std::nullopt; }
    if (pidfd_ >= 0) {
      pollfd exited{pidfd_, POLLIN, 0};
      pollfd pending{socket_fd_, POLLIN, 0};
      // Exited, and the receiver has read all it sent: it says nothing more.
      if (::poll(&exited, 1, 0) > 0 && ::poll(&pending, 1, 0) == 0) {
        for (; seen < messages_.size(); ++seen) {
          auto const& m = messages_[seen];
          if (m.sender == pid && m.text.find(text) != std::string::npos) { return m.text; }
        }
        return std::nullopt;
      }
    }
    changed_.wait_until(lock, std::min(deadline, steady::now() + 100ms));
  }
}

bool service_manager::wait_for_store(
    std::function<bool(std::vector<std::string> const&)> const& done, steady::time_point deadline)
{
  std::unique_lock lock(mutex_);
  while (true) {
    std::vector<std::string> names;
    for (auto const& s : store_) { names.push_back(s.name); }
    if (done(names)) { return true; }
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      names.clear();
      for (auto const& s : store_) { names.push_back(s.name); }
      return done(names);
    }
  }
}

bool service_manager::wait_for_log(std::string_view text, steady::time_point deadline)
{
  std::unique_lock lock(mutex_);
  auto found = [&] {
    return std::any_of(log_.begin(), log_.end(), [&](std::string const& line) {
      return line.find(text) != std::string::npos;
    });
  };
  return changed_.wait_until(lock, deadline, found);
}

std::vector<std::string> service_manager::stored_names() const
{
  std::lock_guard lock(mutex_);
  std::vector<std::string> names;
  for (auto const& s : store_) { names.push_back(s.name); }
  return names;
}

void service_manager::clear_store()
{
  std::lock_guard lock(mutex_);
  for (auto const& s : store_) { ::close(s.fd); }
  store_.clear();
  changed_.notify_all();
}

std::vector<notify_message> service_manager::messages() const
{
  std::lock_guard lock(mutex_);
  return messages_;
}

std::vector<std::string> service_manager::log() const
{
  std::lock_guard lock(mutex_);
  return log_;
}

void service_manager::receive_loop()
{
  while (true) {
    pollfd p[2] = {{socket_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) { continue; }
      return;
    }
    if (p[1].revents != 0) { return; }
    char buffer[4096];
    // systemd accepts up to 768 fds (NOTIFY_FD_MAX) in one message.
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred)) + CMSG_SPACE(sizeof(int) * 768)];
    iovec iov{buffer, sizeof(buffer) - 1};
    msghdr msg{};
    msg.msg_iov        = &iov;
    msg.msg_iovlen     = 1;
    msg.msg_control    = control;
    msg.msg_controllen = sizeof(control);
    auto const got     = ::recvmsg(socket_fd_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (got < 0) { continue; }
    notify_message message;
    std::vector<int> fds;
    bool have_credentials = false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET) { continue; }
      if (c->cmsg_type == SCM_RIGHTS) {
        auto const count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        auto const* data = reinterpret_cast<int const*>(CMSG_DATA(c));
        fds.insert(fds.end(), data, data + count);
      } else if (c->cmsg_type == SCM_CREDENTIALS) {
        ucred cred{};
        std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
        message.sender   = cred.pid;
        have_credentials = true;
      }
    }
    message.text.assign(buffer, static_cast<std::size_t>(got));
    message.fds = fds.size();
    std::lock_guard lock(mutex_);
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
      log_.push_back("notification message truncated, ignoring");
      for (int fd : fds) { ::close(fd); }
      messages_.push_back(std::move(message));
      changed_.notify_all();
      continue;
    }
    if (!have_credentials) {
      log_.push_back("notification message without credentials, ignoring");
      for (int fd : fds) { ::close(fd); }
      messages_.push_back(std::move(message));
      changed_.notify_all();
      continue;
    }
    handle(std::move(message), std::move(fds));
    changed_.notify_all();
  }
}

// Called with mutex_ held.
void service_manager::handle(notify_message message, std::vector<int> fds)
{
  auto const& text = message.text;
  if (main_pid_ <= 0 || message.sender != main_pid_) {
    log_.push_back("notification message from PID " + std::to_string(message.sender) +
                   ", but reception only permitted for main PID " + std::to_string(main_pid_));
    for (int fd : fds) { ::close(fd); }
    messages_.push_back(std::move(message));
    return;
  }
  if (has_line(text, "FDSTORE=1")) {
    auto name               = field(text, "FDNAME");
    std::string stored_name = "stored";
    if (!name || !valid_fd_name(*name)) {
      log_.push_back("passed FDNAME= name is invalid, ignoring");
    } else {
      stored_name = std::string(*name);
    }
    for (int fd : fds) { add_to_store(fd, stored_name); }
  } else if (!fds.empty()) {
    log_.push_back("got file descriptors via the notification socket without FDSTORE=1, closing");
    for (int fd : fds) { ::close(fd); }
  }
  if (has_line(text, "FDSTOREREMOVE=1")) {
    auto name = field(text, "FDNAME");
    if (!name || !valid_fd_name(*name)) {
      log_.push_back(
          "FDSTOREREMOVE=1 requested, but no valid file descriptor name passed, ignoring");
    } else {
      std::erase_if(store_, [&](stored_fd const& s) {
        if (s.name != *name) { return false; }
        ::close(s.fd);
        return true;
      });
    }
  }
  messages_.push_back(std::move(message));
}

// Called with mutex_ held.
void service_manager::add_to_store(int fd, std::string const& name)
{
  for (auto const& s : store_) {
    if (same_open_file(s.fd, fd)) {
      ::close(fd);
      return;
    }
  }
  if (store_.size() >= options_.fd_store_max) {
    log_.push_back("failed to add fd '" + name + "' to the store: the store is full (" +
                   std::to_string(options_.fd_store_max) + " fds, FileDescriptorStoreMax=)");
    ::close(fd);
    return;
  }
  store_.push_back(stored_fd{name, fd});
}

}  // namespace rmmd::harness
