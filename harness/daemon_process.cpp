#include "harness/daemon_process.hpp"

#include "harness/notify_socket.hpp"
#include "harness/run_as.hpp"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace rmmd::harness {
namespace {

/// Removes the directory at the end of the scope unless released.
struct remove_on_failure {
  std::filesystem::path const* dir;
  ~remove_on_failure()
  {
    if (dir == nullptr) { return; }
    std::error_code ec;
    std::filesystem::remove_all(*dir, ec);
  }
};

[[noreturn]] void throw_errno(std::string const& what)
{
  throw std::system_error(errno, std::generic_category(), what);
}

/// Gives `path` to `user` and its primary group, as systemd gives the unit's
/// RuntimeDirectory= to its User= and Group=.
void give_to(std::filesystem::path const& path, system_user const& user)
{
  if (::chown(path.c_str(), user.uid, user.gid) != 0) {
    throw_errno("chown " + path.string() + " to user " + user.name);
  }
}

}  // namespace

daemon_process::daemon_process(options opts) : stop_timeout_(opts.stop_timeout)
{
  if (opts.runtime_dir.empty()) {
    auto tmpl = "/tmp/" + opts.dir_prefix + "XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      throw std::system_error(errno, std::generic_category(), "mkdtemp " + tmpl);
    }
    dir_ = tmpl;
  } else {
    dir_      = opts.runtime_dir;
    owns_dir_ = false;
    std::filesystem::create_directories(dir_);
    // An earlier starter's notify socket file (it closed the socket at READY=1).
    std::filesystem::remove(dir_ / "notify.sock");
  }
  remove_on_failure cleanup{owns_dir_ ? &dir_ : nullptr};
  std::optional<system_user> user;
  if (!opts.user.empty()) {
    user = find_user(opts.user);
    if (!user) {
      throw std::runtime_error("cannot start rmmd as user \"" + opts.user +
                               "\": no such user on this system");
    }
    give_to(dir_, *user);
    // mkdtemp made it 0700: the daemon's group must reach the sockets.
    if (::chmod(dir_.c_str(), 0750) != 0) { throw_errno("chmod 0750 " + dir_.string()); }
  }
  notify_socket notify(dir_ / "notify.sock");
  // Connecting to a Unix socket takes write permission on its file.
  if (user) { give_to(dir_ / "notify.sock", *user); }
  argv_ = {opts.program.string(), "--runtime-dir", dir_.string()};
  argv_.insert(argv_.end(), opts.args.begin(), opts.args.end());

  spawn_options spawn{.kill_last = opts.kill_last, .user = opts.user};
  int log_fd = -1;
  if (opts.log_to_file) {
    // In a directory given to it, after the log of the daemon that ran there before.
    int const keep = owns_dir_ ? O_TRUNC : O_APPEND;
    log_fd = ::open((dir_ / "rmmd.log").c_str(), O_WRONLY | O_CREAT | keep | O_CLOEXEC, 0600);
    if (log_fd < 0) { throw std::system_error(errno, std::generic_category(), "open rmmd.log"); }
    // Nobody reads the daemon's stdout then: a full pipe would stall it.
    spawn.fds = {{STDOUT_FILENO, log_fd}, {STDERR_FILENO, log_fd}};
  }
  try {
    auto env = opts.env;
    env.push_back(notify.env());
    daemon_ = std::make_unique<child_process>(argv_, std::move(env), std::move(spawn));
  } catch (...) {
    if (log_fd >= 0) { ::close(log_fd); }
    throw;
  }
  if (log_fd >= 0) { ::close(log_fd); }
  daemon_->close_stdin();

  auto const deadline = steady::now() + opts.ready_timeout;
  if (!notify.wait_for("READY=1", *daemon_, deadline)) {
    auto status = daemon_->wait(steady::now());
    auto why    = status
                      ? "it exited with status " + std::to_string(*status)
                      : "it was not ready after " +
                         std::to_string(
                             std::chrono::ceil<std::chrono::seconds>(opts.ready_timeout).count()) +
                         " s";
    auto log    = opts.log_to_file ? "; its log ends:\n" + log_tail() : ": " + argv_[0];
    daemon_.reset();  // SIGKILL and reap before the directory goes
    throw std::runtime_error("rmmd did not report READY=1 (" + why + ")" + log);
  }
  cleanup.dir = nullptr;
}

daemon_process::~daemon_process()
{
  if (daemon_) {
    daemon_->kill(SIGTERM);
    daemon_->finish(stop_timeout_);
  }
  if (!owns_dir_) { return; }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

bool daemon_process::alive()
{
  return !daemon_->wait(steady::now());
}

std::optional<int> daemon_process::stop(std::chrono::milliseconds timeout)
{
  if (auto s = daemon_->wait(steady::now())) { return s; }
  daemon_->kill(SIGTERM);
  return daemon_->wait(timeout);
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

}  // namespace rmmd::harness
