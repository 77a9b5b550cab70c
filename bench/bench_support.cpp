#include "bench/bench_support.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>
#include <system_error>

extern char** environ;

namespace rmmd::bench {
namespace {

// Pids the bench started and has not reaped, for kill_all_children(): a fixed
// table of atomics, readable from a signal handler.
constexpr std::size_t max_children = 256;
std::array<std::atomic<pid_t>, max_children> children{};
std::atomic<pid_t> daemon_pid{0};

int register_child(pid_t pid)
{
  for (std::size_t i = 0; i < max_children; ++i) {
    pid_t expected = 0;
    if (children[i].compare_exchange_strong(expected, pid)) { return static_cast<int>(i); }
  }
  return -1;  // table full: the destructor still kills and reaps it
}

int remaining_ms(steady::time_point deadline)
{
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - steady::now());
  return static_cast<int>(std::clamp<long>(left.count(), 0, 1'000'000));
}

[[noreturn]] void throw_errno(std::string const& what)
{
  throw std::system_error(errno, std::generic_category(), what);
}

}  // namespace

void kill_all_children() noexcept
{
  for (auto& c : children) {
    pid_t pid = c.load();
    if (pid > 0) { ::kill(pid, SIGKILL); }
  }
  if (pid_t pid = daemon_pid.load(); pid > 0) { ::kill(pid, SIGKILL); }
}

process::process(std::vector<std::string> argv,
                 std::vector<std::string> env,
                 std::vector<fd_map> fds,
                 int stderr_fd,
                 bool is_daemon)
{
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) { throw_errno("pipe2"); }
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    throw_errno("pipe2");
  }
  // dup2 onto a different number clears FD_CLOEXEC in the child; a parent fd
  // that already has the child's number would keep it, so every handed fd
  // goes through a copy numbered above anything the child asks for.
  std::vector<int> copies;
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  if (stderr_fd >= 0) {
    int copy = ::fcntl(stderr_fd, F_DUPFD_CLOEXEC, 64);
    copies.push_back(copy);
    ::posix_spawn_file_actions_adddup2(&actions, copy, STDERR_FILENO);
    // Nobody reads the daemon's stdout: a full pipe would stall it.
    ::posix_spawn_file_actions_adddup2(&actions, is_daemon ? copy : out[1], STDOUT_FILENO);
  } else {
    ::posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  }
  for (auto [child_fd, parent_fd] : fds) {
    int copy = ::fcntl(parent_fd, F_DUPFD_CLOEXEC, 64);
    copies.push_back(copy);
    ::posix_spawn_file_actions_adddup2(&actions, copy, child_fd);
  }

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
  if (is_daemon) {
    daemon_pid.store(pid_);
  } else {
    slot_ = register_child(pid_);
  }
  stdin_fd_  = in[1];
  stdout_fd_ = out[0];
  pidfd_     = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd_ < 0) {
    int e = errno;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    errno = e;
    throw_errno("pidfd_open");
  }
}

process::~process()
{
  finish(0ms);
  for (int fd : {pidfd_, stdin_fd_, stdout_fd_}) {
    if (fd >= 0) { ::close(fd); }
  }
}

std::optional<std::string> process::read_line(steady::time_point deadline)
{
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
    if (n < 0 && errno == EINTR) { continue; }
    if (n <= 0) { return std::nullopt; }
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
}

void process::write_line(std::string const& line)
{
  auto text = line + "\n";
  if (::write(stdin_fd_, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    throw bench_error("writing to child " + std::to_string(pid_) + ": " + std::strerror(errno));
  }
}

void process::kill(int signal) noexcept
{
  if (!status_) { ::kill(pid_, signal); }
}

std::optional<int> process::wait(steady::time_point deadline)
{
  if (status_) { return status_; }
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
  if (slot_ >= 0) { children[static_cast<std::size_t>(slot_)].store(0); }
  if (daemon_pid.load() == pid_) { daemon_pid.store(0); }
  return status_;
}

int process::finish(std::chrono::milliseconds grace) noexcept
{
  if (pid_ <= 0) { return -1; }
  try {
    if (auto s = wait(steady::now() + grace)) { return *s; }
    ::kill(pid_, SIGKILL);
    if (auto s = wait(steady::now() + 60s)) { return *s; }
  } catch (...) {
  }
  return -1;
}

daemon_process::daemon_process(std::filesystem::path const& rmmd,
                               std::vector<std::string> const& args,
                               std::chrono::seconds ready_timeout)
{
  char tmpl[] = "/tmp/rmmd-bench-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) { throw_errno("mkdtemp"); }
  dir_        = tmpl;
  auto notify = dir_ / "notify.sock";
  int fd      = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) { throw_errno("socket"); }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, notify.c_str(), sizeof(addr.sun_path) - 1);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    throw_errno("bind " + notify.string());
  }
  int log_fd = ::open((dir_ / "rmmd.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (log_fd < 0) {
    ::close(fd);
    throw_errno("open rmmd.log");
  }
  argv_ = {rmmd.string(), "--runtime-dir", dir_.string()};
  argv_.insert(argv_.end(), args.begin(), args.end());
  try {
    process_ =
        std::make_unique<process>(argv_,
                                  std::vector<std::string>{"NOTIFY_SOCKET=" + notify.string()},
                                  std::vector<process::fd_map>{},
                                  log_fd,
                                  true);
  } catch (...) {
    ::close(fd);
    ::close(log_fd);
    throw;
  }
  ::close(log_fd);

  bool ready          = false;
  auto const deadline = steady::now() + ready_timeout;
  while (!ready && steady::now() < deadline && !process_->wait(steady::now())) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) { continue; }  // wake to notice a daemon that died
    char buf[4096];
    auto n = ::recv(fd, buf, sizeof(buf) - 1, 0);
    ready  = n > 0 && std::string_view(buf, static_cast<std::size_t>(n)).find("READY=1") !=
                         std::string_view::npos;
  }
  ::close(fd);
  if (!ready) {
    auto status = process_->wait(steady::now());
    auto why    = status ? "it exited with status " + std::to_string(*status)
                         : "it was not ready after " + std::to_string(ready_timeout.count()) + " s";
    auto tail   = log_tail();
    process_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    throw bench_error("rmmd did not report READY=1 (" + why + "); its log ends:\n" + tail);
  }
}

daemon_process::~daemon_process()
{
  if (process_) {
    process_->kill(SIGTERM);
    process_->finish(20s);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

bool daemon_process::alive()
{
  return !process_->wait(steady::now());
}

std::string daemon_process::log_tail(std::size_t lines) const
{
  std::ifstream in(dir_ / "rmmd.log");
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) { all.push_back(line); }
  std::string out;
  for (auto i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out += "  " + all[i] + "\n";
  }
  return out.empty() ? "  (empty)\n" : out;
}

double cpu_seconds(pid_t pid)
{
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) {
    throw bench_error("cannot read /proc/" + std::to_string(pid) + "/stat");
  }
  // The command name (field 2) may hold spaces: fields count from after its ')'.
  auto close = line.rfind(')');
  if (close == std::string::npos) { throw bench_error("unexpected /proc/PID/stat: " + line); }
  std::istringstream fields(line.substr(close + 2));
  std::vector<std::string> f;
  for (std::string s; fields >> s;) { f.push_back(s); }
  // After ')': field 3 (state) is f[0], so utime (14) is f[11], stime (15) f[12].
  if (f.size() < 13) { throw bench_error("unexpected /proc/PID/stat: " + line); }
  auto ticks = std::stoull(f[11]) + std::stoull(f[12]);
  return static_cast<double>(ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

std::uint64_t rss_bytes(pid_t pid)
{
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream v(line.substr(6));
      std::uint64_t kib = 0;
      v >> kib;
      return kib * 1024;
    }
  }
  throw bench_error("no VmRSS in /proc/" + std::to_string(pid) + "/status");
}

summary summarize(std::vector<double> samples_ns)
{
  summary s;
  s.count = samples_ns.size();
  if (samples_ns.empty()) { return s; }
  std::sort(samples_ns.begin(), samples_ns.end());
  auto rank = [&](double q) {
    auto i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(samples_ns.size())));
    return samples_ns[std::clamp<std::size_t>(i, 1, samples_ns.size()) - 1] / 1000.0;
  };
  s.p50_us  = rank(0.50);
  s.p99_us  = rank(0.99);
  s.min_us  = samples_ns.front() / 1000.0;
  s.max_us  = samples_ns.back() / 1000.0;
  s.mean_us = std::accumulate(samples_ns.begin(), samples_ns.end(), 0.0) /
              static_cast<double>(samples_ns.size()) / 1000.0;
  return s;
}

void json::push_back(json v)
{
  if (std::holds_alternative<std::nullptr_t>(v_)) { v_ = array{}; }
  std::get<array>(v_).push_back(std::move(v));
}

json& json::operator[](std::string const& key)
{
  if (std::holds_alternative<std::nullptr_t>(v_)) { v_ = object{}; }
  auto& members = std::get<object>(v_);
  for (auto& [k, v] : members) {
    if (k == key) { return v; }
  }
  members.emplace_back(key, json{});
  return members.back().second;
}

namespace {

std::string quote(std::string const& s)
{
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace

std::string json::dump(int indent) const
{
  std::string pad(static_cast<std::size_t>(indent) * 2, ' ');
  std::string inner(static_cast<std::size_t>(indent + 1) * 2, ' ');
  return std::visit(
      [&](auto const& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::nullptr_t>) {
          return "null";
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::int64_t>) {
          return std::to_string(v);
        } else if constexpr (std::is_same_v<T, double>) {
          if (!std::isfinite(v)) { return "null"; }
          char buf[64];
          std::snprintf(buf, sizeof(buf), "%.6g", v);
          return buf;
        } else if constexpr (std::is_same_v<T, std::string>) {
          return quote(v);
        } else if constexpr (std::is_same_v<T, array>) {
          if (v.empty()) { return "[]"; }
          std::string out = "[\n";
          for (std::size_t i = 0; i < v.size(); ++i) {
            out += inner + v[i].dump(indent + 1) + (i + 1 < v.size() ? ",\n" : "\n");
          }
          return out + pad + "]";
        } else {
          if (v.empty()) { return "{}"; }
          std::string out = "{\n";
          for (std::size_t i = 0; i < v.size(); ++i) {
            out += inner + quote(v[i].first) + ": " + v[i].second.dump(indent + 1) +
                   (i + 1 < v.size() ? ",\n" : "\n");
          }
          return out + pad + "}";
        }
      },
      v_);
}

}  // namespace rmmd::bench
