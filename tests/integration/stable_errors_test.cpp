// Address-stable memory through the real daemon and the real sockets, where
// no GPU is needed: every refusal of the sleep/wake calls comes back with
// DESIGN.md's code and a message that says what was wrong, the client
// raises the table's exception, and nothing changes in the ledger. (The
// calls that make memory need a CUDA pool: tests/gpu/stable_memory_test.cpp.)

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "tests/tools/child_process.hpp"
#include "tests/tools/daemon_process.hpp"

#include <rmmd/rmmd.h>
#include <rmmd/admin.hpp>
#include <rmmd/stable_memory_resource.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;

class StableErrors : public ::testing::Test {
 protected:
  daemon_process daemon_{{"--host-pool-bytes", "64MiB"}};
  rmmd::session session_ = daemon_.open_session("stable-errors");
  std::uint32_t pool_    = session_.host_pool().id;

  template <class Request, class Response>
  grpc::Status call(grpc::Status (v1::Rmmd::Stub::*method)(grpc::ClientContext*,
                                                           Request const&,
                                                           Response*),
                    Request const& request)
  {
    Response response;
    return rmmd::detail::impl_of(session_).unary(method, request, &response);
  }
};

TEST_F(StableErrors, RefusalsCarryTheTablesCodesAndChangeNothing)
{
  auto held         = session_.allocate(pool_, 4096, 0);  // some state to keep
  auto const before = daemon_.ledger();
  struct refusal {
    grpc::Status status;
    grpc::StatusCode code;
    char const* says;
  };
  auto allocate = [&](std::uint32_t pool, std::uint64_t size, std::string const& tag) {
    v1::StableAllocateRequest r;
    r.set_pool_id(pool);
    r.set_size(size);
    r.set_tag(tag);
    return call(&v1::Rmmd::Stub::StableAllocate, r);
  };
  v1::SleepRequest named_without_backup;
  named_without_backup.set_backup_name("engine-0");
  v1::SleepRequest bad_backup;
  bad_backup.set_backup(static_cast<v1::SleepBackup>(7));
  v1::SleepRequest host_backup;
  host_backup.set_backup(v1::SLEEP_BACKUP_HOST);
  host_backup.set_backup_name("bad name!");
  v1::SleepDoneRequest unknown_done;
  unknown_done.add_allocation_ids(12345);
  v1::WakeRequest unknown_wake;
  unknown_wake.add_allocation_ids(12345);
  v1::WakeRequest long_wake;
  long_wake.set_deadline_ms(3'600'000);
  v1::WakeDoneRequest unknown_wake_done;
  unknown_wake_done.add_allocation_ids(12345);
  v1::RestoreBackupsRequest restore;
  restore.set_backup_name("engine-0");
  v1::DropBackupsRequest drop;
  drop.set_backup_name("engine-0");
  v1::StableFreeRequest free;
  free.set_allocation_id(12345);
  for (auto const& r : {
           refusal{allocate(pool_, 4096, "weights"),
                   grpc::StatusCode::FAILED_PRECONDITION,
                   "cannot make address-stable memory"},
           refusal{allocate(pool_, 4096, ""), grpc::StatusCode::INVALID_ARGUMENT, "tag is empty"},
           refusal{allocate(pool_, 0, "kv"), grpc::StatusCode::INVALID_ARGUMENT, "size 0"},
           refusal{allocate(99, 4096, "kv"), grpc::StatusCode::INVALID_ARGUMENT, "unknown pool"},
           refusal{call(&v1::Rmmd::Stub::Sleep, named_without_backup),
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "backup name without a host backup"},
           refusal{call(&v1::Rmmd::Stub::Sleep, bad_backup),
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "backup 7"},
           refusal{call(&v1::Rmmd::Stub::Sleep, host_backup),
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "backup name"},
           refusal{call(&v1::Rmmd::Stub::SleepDone, unknown_done),
                   grpc::StatusCode::NOT_FOUND,
                   "no address-stable allocation 12345"},
           refusal{call(&v1::Rmmd::Stub::Wake, unknown_wake),
                   grpc::StatusCode::NOT_FOUND,
                   "no address-stable allocation 12345"},
           refusal{call(&v1::Rmmd::Stub::Wake, long_wake),
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "deadline_ms"},
           refusal{call(&v1::Rmmd::Stub::WakeDone, unknown_wake_done),
                   grpc::StatusCode::NOT_FOUND,
                   "12345"},
           refusal{call(&v1::Rmmd::Stub::RestoreBackups, restore),
                   grpc::StatusCode::NOT_FOUND,
                   "no backups kept under that name"},
           refusal{call(&v1::Rmmd::Stub::DropBackups, drop),
                   grpc::StatusCode::NOT_FOUND,
                   "no backups are kept"},
           refusal{call(&v1::Rmmd::Stub::StableFree, free), grpc::StatusCode::NOT_FOUND, "12345"},
       }) {
    EXPECT_EQ(r.status.error_code(), r.code) << r.says << ": " << r.status.error_message();
    EXPECT_THAT(r.status.error_message(), HasSubstr(r.says));
  }
  EXPECT_EQ(daemon_.ledger(), before);
  session_.free(held.id);
}

TEST_F(StableErrors, NothingToSleepOrWakeIsNoError)
{
  v1::SleepRequest all;
  EXPECT_TRUE(call(&v1::Rmmd::Stub::Sleep, all).ok());
  v1::WakeRequest every;
  EXPECT_TRUE(call(&v1::Rmmd::Stub::Wake, every).ok());
  auto reply = rmmd::admin(session_).sleepers_json();
  EXPECT_THAT(reply, HasSubstr("\"wake_failures\":\"0\""));
}

TEST_F(StableErrors, RmmctlListsNoSleepersAndRefusesToDropAnUnknownName)
{
  auto const dir = daemon_.runtime_dir().string();
  auto table     = run({program_path("rmmctl").string(), "--runtime-dir", dir, "sleepers"});
  EXPECT_EQ(table.status, 0) << table.out;
  EXPECT_THAT(table.out, HasSubstr("BACKUP NAME"));
  EXPECT_THAT(table.out, HasSubstr("(nobody sleeps)"));
  EXPECT_THAT(table.out, HasSubstr("wake waits 0, wake failures 0"));
  auto json = run({program_path("rmmctl").string(), "--runtime-dir", dir, "sleepers", "--json"});
  EXPECT_EQ(json.status, 0) << json.out;
  EXPECT_THAT(json.out, HasSubstr("\"wake_waits\""));
  auto drop =
      run({program_path("rmmctl").string(), "--runtime-dir", dir, "sleepers", "drop", "engine-9"});
  EXPECT_NE(drop.status, 0) << drop.out;
}

TEST_F(StableErrors, TheClientRaisesTheTablesExceptions)
{
  // A host pool is no place for address-stable memory.
  EXPECT_THROW(rmmd::stable_memory_resource(session_, "host", "default"), rmmd::logic_error);
  EXPECT_THROW((void)rmmd::admin(session_).drop_backups("engine-0"), rmmd::not_found_error);
}

TEST_F(StableErrors, TheCAbiSaysWhatWasWrong)
{
  rmmd_session_t session = nullptr;
  rmmd_session_options options{};
  options.size        = sizeof options;
  auto const dir      = daemon_.runtime_dir().string();
  options.runtime_dir = dir.c_str();
  ASSERT_EQ(rmmd_session_create(&options, &session), RMMD_SUCCESS) << rmmd_last_error_message();
  rmmd_stable_resource_t resource = nullptr;
  EXPECT_EQ(rmmd_stable_resource_create(session, 0, "host", "default", &resource),
            RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(rmmd_last_error_message(), HasSubstr("not a CUDA pool"));
  EXPECT_EQ(resource, nullptr);
  uint64_t dropped = 7;
  EXPECT_EQ(rmmd_stable_drop_backups(session, "engine-0", &dropped), RMMD_ERROR_NOT_FOUND);
  EXPECT_EQ(dropped, 7u);
  char* json = nullptr;
  ASSERT_EQ(rmmd_stable_sleepers_json(session, &json), RMMD_SUCCESS) << rmmd_last_error_message();
  EXPECT_THAT(json, HasSubstr("wake_waits"));
  rmmd_string_free(json);
  EXPECT_EQ(
      rmmd_stable_sleep(nullptr, nullptr, 0, RMMD_SLEEP_BACKUP_NONE, nullptr, nullptr, nullptr),
      RMMD_ERROR_INVALID_ARGUMENT);
  rmmd_session_destroy(session);
}

TEST_F(StableErrors, TheTorchStableEntryPointsRefuseBadArgumentsWithoutASession)
{
  // Each refusal comes before the process-wide session is made (no GPU
  // here; tests/gpu/stable_memory_test.cpp allocates through them).
  rmmd_stable_resource_t resource = nullptr;
  EXPECT_EQ(rmmd_torch_stable_resource(-1, &resource), RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(rmmd_last_error_message(), HasSubstr("device -1 is not a CUDA device"));
  EXPECT_EQ(resource, nullptr);
  EXPECT_EQ(rmmd_torch_stable_resource(64, &resource), RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(rmmd_torch_stable_resource(0, nullptr), RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(rmmd_torch_stable_malloc(4096, 64, nullptr), nullptr);
  EXPECT_THAT(rmmd_last_error_message(), HasSubstr("device 64 is not a CUDA device"));
  EXPECT_EQ(rmmd_torch_stable_devices(nullptr), RMMD_ERROR_INVALID_ARGUMENT);
  std::uint64_t devices = 7;
  ASSERT_EQ(rmmd_torch_stable_devices(&devices), RMMD_SUCCESS);
  EXPECT_EQ(devices, 0u);
  // Frees of what no stable resource lent do nothing.
  int not_ours = 0;
  rmmd_torch_stable_free(nullptr, 0, 0, nullptr);
  rmmd_torch_stable_free(&not_ours, 4, 0, nullptr);
  rmmd_torch_stable_free(&not_ours, 4, -1, nullptr);
  char out[16];
  std::size_t copied = 3;
  EXPECT_EQ(rmmd_stable_read_backup(nullptr, &not_ours, 4, out, &copied),
            RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(copied, 3u);
}

}  // namespace
}  // namespace rmmd::test
