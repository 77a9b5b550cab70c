#include "harness/child_process.hpp"

#include "harness/run_as.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <system_error>
#include <utility>

extern char** environ;

namespace rmmd::harness {
namespace {

// Children started and not reaped, for kill_all_children(): a fixed table of
// atomics, readable from a signal handler. A kill_last child is stored as -pid.
constexpr std::size_t max_children = 256;
std::array<std::atomic<pid_t>, max_children> children{};

int register_child(pid_t pid, bool kill_last)
{
  for (std::size_t i = 0; i < max_children; ++i) {
    pid_t expected = 0;
    if (children[i].compare_exchange_strong(expected, kill_last ? -pid : pid)) {
      return static_cast<int>(i);
    }
  }
  return -1;  // table full: the destructor still kills and reaps it
}

int remaining_ms(steady::time_point deadline)
{
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - steady::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, INT_MAX));
}

[[noreturn]] void throw_errno(std::string const& what)
{
  throw std::system_error(errno, std::generic_category(), what);
}

/// Appends the next chunk `fd` has to `buffer`; false at EOF or the deadline.
bool read_more(int fd, std::string& buffer, steady::time_point deadline)
{
  while (true) {
    pollfd p{fd, POLLIN, 0};
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc < 0 && errno == EINTR) { continue; }
    if (rc <= 0) { return false; }
    char chunk[4096];
    auto n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) { continue; }
    if (n <= 0) { return false; }
    buffer.append(chunk, static_cast<std::size_t>(n));
    return true;
  }
}

}  // namespace

void kill_all_children() noexcept
{
  for (auto& c : children) {
    if (pid_t pid = c.load(); pid > 0) { ::kill(pid, SIGKILL); }
  }
  for (auto& c : children) {
    if (pid_t pid = c.load(); pid < 0) { ::kill(-pid, SIGKILL); }
  }
}

child_process::child_process(std::vector<std::string> argv,
                             std::vector<std::string> env,
                             spawn_options opts)
{
  if (!opts.user.empty()) {
    auto prefix = run_as_prefix(opts.user);
    argv.insert(argv.begin(), prefix.begin(), prefix.end());
  }
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) { throw_errno("pipe2"); }
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    throw_errno("pipe2");
  }
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  ::posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  if (opts.merge_stderr) { ::posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO); }
  // dup2 onto a different number clears FD_CLOEXEC in the child; a parent fd
  // that already has the child's number would keep it, so every handed fd
  // goes through a copy numbered above anything the child asks for.
  std::vector<int> copies;
  for (auto [child_fd, parent_fd] : opts.fds) {
    int copy = ::fcntl(parent_fd, F_DUPFD_CLOEXEC, 64);
    copies.push_back(copy);
    ::posix_spawn_file_actions_adddup2(&actions, copy, child_fd);
  }

  std::vector<char*> args;
  for (auto& a : argv) { args.push_back(a.data()); }
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  auto name_of = [](std::string const& entry) { return entry.substr(0, entry.find('=')); };
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    bool const replaced = std::any_of(
        env.begin(), env.end(), [&](std::string const& x) { return name_of(x) == name_of(entry); });
    if (!replaced) { env_strings.push_back(std::move(entry)); }
  }
  env_strings.insert(env_strings.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& e : env_strings) { envp.push_back(e.data()); }
  envp.push_back(nullptr);

  int rc = ::posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), envp.data());
  ::posix_spawn_file_actions_destroy(&actions);
  for (int c : copies) {
    if (c >= 0) { ::close(c); }
  }
  ::close(in[0]);
  ::close(out[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    throw std::system_error(rc, std::generic_category(), "posix_spawn " + argv[0]);
  }
  stdin_fd_  = in[1];
  stdout_fd_ = out[0];
  pidfd_     = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd_ < 0) {
    int e = errno;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    ::close(stdin_fd_);
    ::close(stdout_fd_);
    errno = e;
    throw_errno("pidfd_open");
  }
  slot_ = register_child(pid_, opts.kill_last);
}

child_process::child_process(child_process&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      pidfd_(std::exchange(other.pidfd_, -1)),
      stdin_fd_(std::exchange(other.stdin_fd_, -1)),
      stdout_fd_(std::exchange(other.stdout_fd_, -1)),
      slot_(std::exchange(other.slot_, -1)),
      buffer_(std::move(other.buffer_)),
      status_(other.status_)
{
}

child_process::~child_process()
{
  finish(0ms);
  for (int fd : {pidfd_, stdin_fd_, stdout_fd_}) {
    if (fd >= 0) { ::close(fd); }
  }
}

std::optional<std::string> child_process::read_line(steady::time_point deadline)
{
  while (true) {
    if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
      auto line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (!read_more(stdout_fd_, buffer_, deadline)) { return std::nullopt; }
  }
}

std::string child_process::read_all(std::chrono::milliseconds timeout)
{
  auto const deadline = steady::now() + timeout;
  while (read_more(stdout_fd_, buffer_, deadline)) {}
  return std::exchange(buffer_, {});
}

void child_process::write_line(std::string const& line)
{
  auto text = line + "\n";
  if (::write(stdin_fd_, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    throw_errno("writing to child " + std::to_string(pid_));
  }
}

void child_process::close_stdin()
{
  if (stdin_fd_ >= 0) { ::close(std::exchange(stdin_fd_, -1)); }
}

void child_process::kill(int signal) noexcept
{
  if (pid_ > 0 && !status_) { ::kill(pid_, signal); }
}

std::optional<int> child_process::wait(steady::time_point deadline)
{
  if (status_ || pid_ <= 0) { return status_; }
  pollfd p{pidfd_, POLLIN, 0};
  while (true) {
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc < 0 && errno == EINTR) { continue; }
    if (rc <= 0) { return std::nullopt; }
    break;
  }
  int status = 0;
  if (::waitpid(pid_, &status, 0) != pid_) { return std::nullopt; }
  status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (slot_ >= 0) { children[static_cast<std::size_t>(std::exchange(slot_, -1))].store(0); }
  return status_;
}

int child_process::finish(std::chrono::milliseconds grace) noexcept
{
  if (pid_ <= 0) { return -1; }
  if (auto s = wait(steady::now() + grace)) { return *s; }
  kill(SIGKILL);
  if (auto s = wait(steady::now() + 60s)) { return *s; }
  return -1;
}

}  // namespace rmmd::harness
