#include "tests/tools/child_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <utility>

extern char** environ;

namespace rmmd::test {
namespace {

int remaining_ms(std::chrono::steady_clock::time_point deadline)
{
  auto left =
      std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::max<long>(0, left.count()));
}

}  // namespace

std::filesystem::path program_path(std::string const& name)
{
  if (char const* dir = std::getenv("RMMD_BIN_DIR"); dir != nullptr && *dir != '\0') {
    return std::filesystem::path(dir) / name;
  }
  auto beside = std::filesystem::read_symlink("/proc/self/exe").parent_path() / name;
  if (std::filesystem::exists(beside)) { return beside; }
  static constexpr std::pair<char const*, char const*> in_build_tree[] = {
      {"rmmd", "daemon/rmmd"},
      {"rmmctl", "client/rmmctl"},
      {"rmmd_test_client", "tests/rmmd_test_client"},
      {"rmmd_hello", "examples/rmmd_hello"}};
  for (auto [program, relative] : in_build_tree) {
    if (name == program) { return std::filesystem::path(RMMD_BUILD_DIR) / relative; }
  }
  return std::filesystem::path(RMMD_BUILD_DIR) / name;
}

child_process::child_process(std::vector<std::string> argv,
                             std::vector<std::string> env,
                             bool merge_stderr)
{
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "pipe2");
  }
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  ::posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  if (merge_stderr) { ::posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO); }

  std::vector<char*> args;
  for (auto& a : argv) { args.push_back(a.data()); }
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) { env_strings.emplace_back(*e); }
  env_strings.insert(env_strings.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& e : env_strings) { envp.push_back(e.data()); }
  envp.push_back(nullptr);

  int rc = ::posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), envp.data());
  ::posix_spawn_file_actions_destroy(&actions);
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
}

child_process::child_process(child_process&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      pidfd_(std::exchange(other.pidfd_, -1)),
      stdin_fd_(std::exchange(other.stdin_fd_, -1)),
      stdout_fd_(std::exchange(other.stdout_fd_, -1)),
      buffer_(std::move(other.buffer_)),
      status_(other.status_)
{
}

child_process::~child_process()
{
  if (pid_ > 0 && !status_) {
    ::kill(pid_, SIGKILL);
    wait(60s);
  }
  for (int fd : {pidfd_, stdin_fd_, stdout_fd_}) {
    if (fd >= 0) { ::close(fd); }
  }
}

std::optional<std::string> child_process::read_line(std::chrono::milliseconds timeout)
{
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
      auto line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    pollfd p{stdout_fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc < 0 && errno == EINTR) { continue; }
    if (rc <= 0) { return std::nullopt; }
    char chunk[4096];
    auto n = ::read(stdout_fd_, chunk, sizeof(chunk));
    if (n <= 0) { return std::nullopt; }
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
}

std::string child_process::read_all(std::chrono::milliseconds timeout)
{
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    pollfd p{stdout_fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc < 0 && errno == EINTR) { continue; }
    if (rc <= 0) { break; }
    char chunk[4096];
    auto n = ::read(stdout_fd_, chunk, sizeof(chunk));
    if (n <= 0) { break; }
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
  return std::exchange(buffer_, {});
}

void child_process::write_line(std::string const& line)
{
  auto text = line + "\n";
  if (::write(stdin_fd_, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    throw std::system_error(errno, std::generic_category(), "write to child");
  }
}

void child_process::close_stdin()
{
  if (stdin_fd_ >= 0) { ::close(std::exchange(stdin_fd_, -1)); }
}

void child_process::kill(int signal)
{
  ::kill(pid_, signal);
}

std::optional<int> child_process::wait(std::chrono::milliseconds timeout)
{
  if (status_) { return status_; }
  pollfd p{pidfd_, POLLIN, 0};
  while (true) {
    int rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
    if (rc < 0 && errno == EINTR) { continue; }
    if (rc <= 0) { return std::nullopt; }
    break;
  }
  int status = 0;
  if (::waitpid(pid_, &status, 0) != pid_) { return std::nullopt; }
  status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return status_;
}

run_result run(std::vector<std::string> argv, std::chrono::milliseconds timeout)
{
  child_process child(std::move(argv));
  child.close_stdin();
  auto out    = child.read_all(timeout);
  auto status = child.wait(timeout);
  return {.status = status.value_or(-1), .out = std::move(out)};
}

}  // namespace rmmd::test
