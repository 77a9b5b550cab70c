#include "harness/peer_setup.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

namespace rmmd::harness {

int free_loopback_port()
{
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) { return 0; }
  sockaddr_in a{};
  a.sin_family      = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len     = sizeof(a);
  int port          = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

std::filesystem::path find_certs_script(std::filesystem::path const& source_dir)
{
  namespace fs = std::filesystem;
  if (char const* p = std::getenv("RMMD_TEST_CERTS_SCRIPT"); p != nullptr && *p != '\0') {
    return p;
  }
  std::error_code ec;
  auto const self = fs::read_symlink("/proc/self/exe", ec);
  for (auto const& candidate : {ec ? fs::path() : self.parent_path() / "make-test-certs.sh",
                                source_dir / "scripts" / "make-test-certs.sh"}) {
    if (!candidate.empty() && fs::exists(candidate, ec)) { return candidate; }
  }
  return {};
}

}  // namespace rmmd::harness
