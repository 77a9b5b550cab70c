// A service for the fd-store tests (tests/restart/fd_store_restart_test.cpp),
// run under harness::service_manager: it takes the fds passed at start with
// rmmd's own code (restart::take_passed_fds), reports them, then stores and
// removes fds as its arguments say with restart::fd_store, says READY=1 and
// waits to be killed.
//
//   rmmd_fd_store_test_service [store BUFFER_NAME TEXT | store-as FDNAME TEXT | remove FDNAME]...
//
// First message: "STATUS=passed buffers: <fd name>=<content>, ... | others: <name>, ..."
// (each memfd's content read from offset 0). `store` puts a new memfd holding
// TEXT under buffer_fd_name(next id, BUFFER_NAME), the next id being one above
// the largest passed; `store-as` under FDNAME as given. An fd_store error is
// reported as "STATUS=error: ..." and the program exits 1.

#include "daemon/restart/fd_store.hpp"

#include <systemd/sd-daemon.h>

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

std::string content_of(int fd)
{
  struct stat st {};
  if (::fstat(fd, &st) != 0) { return "<fstat failed>"; }
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  if (::pread(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    return "<pread failed>";
  }
  return text;
}

int memfd_holding(std::string const& text)
{
  int fd = ::memfd_create("fd-store-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    std::perror("memfd");
    std::exit(2);
  }
  return fd;
}

[[noreturn]] void fail(std::string const& what)
{
  ::sd_notifyf(0, "STATUS=error: %s", what.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv)
{
  auto passed           = rmmd::restart::take_passed_fds();
  std::string status    = "STATUS=passed buffers:";
  std::uint64_t next_id = 1;
  for (auto const& b : passed.stored) {
    status += " " + b.name + "=" + content_of(b.fd.get()) + ",";
    if (b.fd_id >= next_id) { next_id = b.fd_id + 1; }
  }
  status += " | others:";
  for (auto const& o : passed.others) { status += " " + o.name + ","; }
  ::sd_notify(0, status.c_str());

  rmmd::restart::fd_store store;
  std::vector<int> keep;  // the service's own copies, as rmmd keeps them
  for (int i = 1; i < argc; ++i) {
    std::string const verb = argv[i];
    if ((verb == "store" || verb == "store-as") && i + 2 < argc) {
      std::string const name = verb == "store"
                                   ? rmmd::restart::buffer_fd_name(next_id++, argv[i + 1])
                                   : std::string(argv[i + 1]);
      int fd                 = memfd_holding(argv[i + 2]);
      if (auto s = store.store(name, fd); !s.ok()) { fail(std::string(s.message())); }
      keep.push_back(fd);
      i += 2;
    } else if (verb == "remove" && i + 1 < argc) {
      if (auto s = store.remove(argv[i + 1]); !s.ok()) { fail(std::string(s.message())); }
      i += 1;
    } else {
      fail("unknown arguments at '" + verb + "'");
    }
  }
  ::sd_notify(0, "READY=1");
  while (true) { ::pause(); }
}
