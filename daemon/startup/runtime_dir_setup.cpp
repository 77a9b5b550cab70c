#include "daemon/startup/runtime_dir_setup.hpp"

#include "daemon/log.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace rmmd::startup {
namespace {

namespace fs = std::filesystem;

/// Takes the runtime directory for this process: an exclusive lock on
/// DIR/rmmd.lock, held by the open fd until the process ends, however it
/// ends (SIGKILL included). The socket files that a killed rmmd left behind
/// are replaced at start; a live rmmd's must not be: the second daemon would
/// take over the sockets while the first went on serving its sessions unseen,
/// both lending the same memory. Returns the fd, or -1 after saying why.
int lock_runtime_dir(fs::path const& dir)
{
  auto const path = dir / "rmmd.lock";
  int fd          = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    log::error("cannot open %s: %s", path.string(), std::strerror(errno));
    return -1;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int const err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      log::error(
          "another rmmd is running with the runtime directory %s (it holds %s); stop it "
          "first, or give this one another --runtime-dir",
          dir.string(),
          path.string());
    } else {
      log::error("cannot lock %s: %s", path.string(), std::strerror(err));
    }
    return -1;
  }
  return fd;
}

}  // namespace

bool give_to_group(fs::path const& path, config::daemon_settings const& s)
{
  if (!s.socket_group) { return true; }
  if (::chown(path.c_str(), static_cast<uid_t>(-1), *s.socket_group) != 0) {
    log::error("cannot give %s to group %s (gid %d): %s; run rmmd as a member of that group",
               path.string(),
               s.socket_group_name,
               *s.socket_group,
               std::strerror(errno));
    return false;
  }
  return true;
}

bool prepare_runtime_dir(config::daemon_settings const& settings)
{
  fs::path const& dir = settings.runtime_dir;
  try {
    if (!fs::exists(dir)) {
      fs::create_directories(dir);
      fs::permissions(dir, static_cast<fs::perms>(settings.runtime_dir_mode));
      if (!give_to_group(dir, settings)) { return false; }
    }
  } catch (fs::filesystem_error const& e) {
    log::error("cannot create the runtime directory %s: %s", dir.string(), e.what());
    return false;
  }
  // The lock's fd stays open, never closed, until the process ends.
  return lock_runtime_dir(dir) >= 0;
}

}  // namespace rmmd::startup
