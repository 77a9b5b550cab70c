// A client for the admission tests that speaks the session socket's hello
// itself, so that it can hold connections that never say hello. Started as
// another user (spawn_options::user), it is that user's connections.
//
//   rmmd_session_opener RUNTIME_DIR
//
// Reads commands on stdin, one per line, and answers each with one line:
//   silent N          opens N connections and says nothing on them;
//                     "silent TOTAL" (the silent connections it holds)
//   refused-silent    opens one connection, says nothing, and waits (20 s at
//                     most) for the daemon to refuse it: "refused CODE
//                     MESSAGE", "closed" (no welcome) or "no answer"
//   hello             opens one connection and sends a hello: "welcome ID"
//                     (the session stays open), "refused CODE MESSAGE" or
//                     "closed"
//   close-silent N    closes N of its silent connections: "closed N"
//   close-sessions N  ends N of its sessions: "closed N"

#include "harness/raw_session.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string runtime_dir;
std::vector<int> silent;
std::vector<int> sessions;

int connect_to_daemon()
{
  try {
    return rmmd::harness::connect_session_socket(runtime_dir);
  } catch (std::system_error const& e) {
    std::printf("error: %s\n", e.what());
    std::fflush(stdout);
    std::exit(1);
  }
}

/// The daemon's answer on `fd` within 20 s: "welcome ID", "refused CODE
/// MESSAGE", "closed" or "no answer". Fds attached to it are closed.
std::string read_answer(int fd)
{
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 20'000) <= 0) { return "no answer"; }
  std::vector<char> buffer(1 << 16);
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 64)];
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov        = &iov;
  msg.msg_iovlen     = 1;
  msg.msg_control    = control;
  msg.msg_controllen = sizeof(control);
  auto n             = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  for (auto* c = CMSG_FIRSTHDR(&msg); n > 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      for (std::size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
        int received{};
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        ::close(received);
      }
    }
  }
  if (n <= 0) { return "closed"; }
  rmmd::v1::SessionWelcome welcome;
  if (!welcome.ParseFromArray(buffer.data(), static_cast<int>(n))) { return "bad welcome"; }
  if (welcome.has_error()) {
    return "refused " + std::to_string(welcome.error().code()) + " " + welcome.error().message();
  }
  return "welcome " + std::to_string(welcome.session_id());
}

/// Closes the last `n` of `fds`; how many it closed.
int close_some(std::vector<int>& fds, int n)
{
  int closed = 0;
  for (; closed < n && !fds.empty(); ++closed) {
    ::close(fds.back());
    fds.pop_back();
  }
  return closed;
}

}  // namespace

int main(int argc, char** argv)
{
  if (argc != 2) {
    std::fprintf(stderr, "usage: rmmd_session_opener RUNTIME_DIR (commands on stdin)\n");
    return 2;
  }
  runtime_dir = argv[1];
  for (std::string line; std::getline(std::cin, line);) {
    std::istringstream in(line);
    std::string command;
    int n = 0;
    in >> command >> n;
    std::string answer;
    if (command == "silent") {
      for (int i = 0; i < n; ++i) { silent.push_back(connect_to_daemon()); }
      answer = "silent " + std::to_string(silent.size());
    } else if (command == "refused-silent") {
      int fd = connect_to_daemon();
      answer = read_answer(fd);
      ::close(fd);
    } else if (command == "hello") {
      int fd = connect_to_daemon();
      rmmd::v1::SessionHello hello;
      hello.set_protocol_version(1);
      hello.set_client_name("session-opener");
      auto bytes = hello.SerializeAsString();
      // A daemon that refused the connection before the hello came has
      // closed it (the send fails), but its answer is there to read.
      ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      answer = read_answer(fd);
      if (answer.rfind("welcome ", 0) == 0) {
        sessions.push_back(fd);
      } else {
        ::close(fd);
      }
    } else if (command == "close-silent") {
      answer = "closed " + std::to_string(close_some(silent, n));
    } else if (command == "close-sessions") {
      answer = "closed " + std::to_string(close_some(sessions, n));
    } else {
      answer = "error: unknown command: " + line;
    }
    std::printf("%s\n", answer.c_str());
    std::fflush(stdout);
  }
  return 0;
}
