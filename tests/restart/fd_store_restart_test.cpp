// rmmd's fd-store code (daemon/restart/fd_store.hpp) in a real process
// under harness::service_manager, which keeps the fds across a SIGKILL and
// passes them to the next start as systemd does: a memfd's bytes survive
// the crash, FDSTOREREMOVE drops an fd, the store's limit holds, and socket
// fds are told apart from stored buffers.

#include "daemon/restart/fd_store.hpp"
#include "harness/service_manager.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace rmmd::restart {
namespace {

using harness::service_manager;
using harness::steady;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using namespace std::chrono_literals;

/// The test service: beside this binary where it is (a bundle on the GPU
/// host), else where the build made it.
std::string service_program()
{
  auto beside = std::filesystem::read_symlink("/proc/self/exe").parent_path() /
                std::filesystem::path(RMMD_FD_STORE_TEST_SERVICE).filename();
  return std::filesystem::exists(beside) ? beside.string() : RMMD_FD_STORE_TEST_SERVICE;
}

class FdStoreRestart : public ::testing::Test {
 protected:
  void SetUp() override
  {
    char tmpl[] = "/tmp/rmmd-fdstore-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override
  {
    std::filesystem::remove_all(dir_);
  }

  harness::service_manager_options options(std::size_t max = 4096)
  {
    return {.notify_socket = dir_ / "notify", .fd_store_max = max};
  }

  /// Starts the service with `args` and returns its first status (what was
  /// passed), once it said READY=1.
  static std::string start(service_manager& manager, std::vector<std::string> args = {})
  {
    args.insert(args.begin(), service_program());
    manager.start(args);
    auto const deadline = steady::now() + 20s;
    auto passed         = manager.wait_for("STATUS=passed", deadline);
    EXPECT_TRUE(passed.has_value()) << "the service did not report what was passed";
    auto ready = manager.wait_for("READY=1", deadline);
    EXPECT_TRUE(ready.has_value()) << "the service did not say READY=1";
    return passed.value_or("");
  }

  std::filesystem::path dir_;
};

TEST_F(FdStoreRestart, AStoredMemfdComesBackAfterSigkillWithItsBytes)
{
  service_manager manager(options());
  auto first = start(manager, {"store", "team/weights", "bytes of the weights"});
  EXPECT_THAT(first, HasSubstr("buffers: | others:"));  // nothing passed at the first start
  EXPECT_THAT(manager.stored_names(), ElementsAre("rmmd-buffer-1.team/weights"));

  auto status = manager.kill_service(SIGKILL);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFSIGNALED(*status));

  auto second = start(manager);
  EXPECT_THAT(second, HasSubstr("rmmd-buffer-1.team/weights=bytes of the weights,"));
  EXPECT_THAT(second, EndsWith("| others:"));  // nothing but the buffer
  // Passing fds to a start leaves them in the store: a second crash keeps them too.
  manager.kill_service(SIGKILL);
  auto third = start(manager);
  EXPECT_THAT(third, HasSubstr("rmmd-buffer-1.team/weights=bytes of the weights,"));
  EXPECT_THAT(manager.log(), IsEmpty());
}

TEST_F(FdStoreRestart, FdStoreRemoveDropsOnlyThatName)
{
  service_manager manager(options());
  start(manager, {"store", "a", "first", "store", "b", "second"});
  EXPECT_THAT(manager.stored_names(), ElementsAre("rmmd-buffer-1.a", "rmmd-buffer-2.b"));
  manager.kill_service();

  auto passed = start(manager, {"remove", "rmmd-buffer-1.a"});
  EXPECT_THAT(passed,
              AllOf(HasSubstr("rmmd-buffer-1.a=first,"), HasSubstr("rmmd-buffer-2.b=second,")));
  EXPECT_THAT(manager.stored_names(), ElementsAre("rmmd-buffer-2.b"));
  manager.kill_service();

  passed = start(manager);
  EXPECT_THAT(passed, Not(HasSubstr("rmmd-buffer-1.a")));
  EXPECT_THAT(passed, HasSubstr("rmmd-buffer-2.b=second,"));
}

TEST_F(FdStoreRestart, TheStoreKeepsAtMostItsLimit)
{
  service_manager manager(options(2));
  start(manager, {"store", "a", "1", "store", "b", "2", "store", "c", "3"});
  EXPECT_THAT(manager.stored_names(), ElementsAre("rmmd-buffer-1.a", "rmmd-buffer-2.b"));
  ASSERT_EQ(manager.log().size(), 1u);
  EXPECT_THAT(manager.log()[0], HasSubstr("the store is full"));
  manager.kill_service();

  auto passed = start(manager);
  EXPECT_THAT(passed, AllOf(HasSubstr("rmmd-buffer-1.a=1,"), HasSubstr("rmmd-buffer-2.b=2,")));
  EXPECT_THAT(passed, Not(HasSubstr("rmmd-buffer-3")));
}

TEST_F(FdStoreRestart, SocketsAndUnknownStoredFdsAreNotBuffers)
{
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  auto opts    = options();
  opts.sockets = {{"rmmd.socket", pair[0]}};
  service_manager manager(opts);
  ::close(pair[0]);
  ::close(pair[1]);
  auto first = start(manager, {"store", "w", "x", "store-as", "left-by-another-version", "y"});
  EXPECT_THAT(first, HasSubstr("buffers: | others: rmmd.socket,"));
  manager.kill_service();

  auto second = start(manager);
  EXPECT_THAT(second,
              HasSubstr("buffers: rmmd-buffer-1.w=x, | others: rmmd.socket, "
                        "left-by-another-version,"));
}

TEST_F(FdStoreRestart, AMessageFromAnotherProcessIsIgnored)
{
  service_manager manager(options());
  start(manager);
  // This process is not the service's main process: systemd with
  // NotifyAccess=main drops what it sends, fds included.
  ::setenv("NOTIFY_SOCKET", (dir_ / "notify").c_str(), 1);
  {
    fd_store store;
    int pipe_fds[2];
    ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
    EXPECT_TRUE(store.store(buffer_fd_name(5, "intruder"), pipe_fds[0]).ok());
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
  }
  ::unsetenv("NOTIFY_SOCKET");
  ASSERT_TRUE(manager.wait_for_log("only permitted for main PID", steady::now() + 20s));
  EXPECT_THAT(manager.stored_names(), IsEmpty());
}

}  // namespace
}  // namespace rmmd::restart
