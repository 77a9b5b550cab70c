#include "harness/run_as.hpp"

#include <unistd.h>

#include <stdexcept>

namespace rmmd::harness {
namespace {

constexpr char const* setpriv_path = "/usr/bin/setpriv";

}  // namespace

std::vector<std::string> run_as_prefix(std::string const& user)
{
  auto found = find_user(user);
  if (!found) {
    throw std::runtime_error("cannot run a program as user \"" + user +
                             "\": no such user on this system (create it, e.g. useradd --system "
                             "--no-create-home " +
                             user + ")");
  }
  if (::geteuid() != 0 && ::geteuid() != found->uid) {
    throw std::runtime_error("cannot run a program as user \"" + user +
                             "\": only root may start a process as another user (this process "
                             "runs as uid " +
                             std::to_string(::geteuid()) + ")");
  }
  if (::access(setpriv_path, X_OK) != 0) {
    throw std::runtime_error(std::string("cannot run a program as user \"") + user +
                             "\": " + setpriv_path +
                             " is missing; install util-linux (Debian and Ubuntu ship it)");
  }
  return {setpriv_path,
          "--reuid=" + std::to_string(found->uid),
          "--regid=" + std::to_string(found->gid),
          "--init-groups",
          "--"};
}

}  // namespace rmmd::harness
