#include "daemon/restart/buffer_adoption.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace rmmd::restart {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

v1::StoredBuffer record(std::uint64_t fd_id,
                        std::string const& name,
                        v1::StoredBufferKind kind = v1::STORED_BUFFER_KIND_HOST_MEMFD)
{
  v1::StoredBuffer b;
  b.set_fd_id(fd_id);
  b.set_fd_name(buffer_fd_name(fd_id, name));
  b.set_name(name);
  b.set_size(4000);
  b.set_allocation_bytes(4096);
  b.set_kind(kind);
  if (kind == v1::STORED_BUFFER_KIND_VMM_POSIX_FD) { b.set_gpu_uuid("GPU-1"); }
  b.set_state(v1::BUFFER_STATE_PUBLISHED);
  return b;
}

v1::BufferRegistryState state_of(std::vector<v1::StoredBuffer> records, std::uint64_t next)
{
  v1::BufferRegistryState s;
  s.set_format_version(1);
  s.set_next_fd_id(next);
  for (auto& r : records) { *s.add_buffers() = r; }
  return s;
}

fd_facts sealed_memfd(std::uint64_t bytes)
{
  return fd_facts{.open = true, .memfd = true, .sealed_size = true, .bytes = bytes};
}

fd_facts device_fd()
{
  return fd_facts{.open = true};
}

TEST(DecideAdoption, RecordsWithTheirFdAreAdopted)
{
  auto const state =
      state_of({record(1, "a"), record(2, "b", v1::STORED_BUFFER_KIND_VMM_POSIX_FD)}, 3);
  auto const n1 = buffer_fd_name(1, "a");
  auto const n2 = buffer_fd_name(2, "b");
  std::vector<stored_fd_view> fds{{2, n2, device_fd()}, {1, n1, sealed_memfd(4096)}};
  auto d = decide_adoption(&state, fds);
  EXPECT_THAT(d.problems, IsEmpty());
  EXPECT_THAT(d.adopt,
              ElementsAre(std::pair<std::size_t, std::size_t>{0, 1},
                          std::pair<std::size_t, std::size_t>{1, 0}));
  EXPECT_THAT(d.drop_fds, IsEmpty());
  EXPECT_EQ(d.next_fd_id, 3u);
}

TEST(DecideAdoption, ARecordWithoutAnFdIsDroppedInWords)
{
  auto const state = state_of({record(1, "a")}, 2);
  auto d           = decide_adoption(&state, {});
  EXPECT_THAT(d.adopt, IsEmpty());
  EXPECT_THAT(d.drop_records, ElementsAre(0u));
  ASSERT_THAT(d.problems, SizeIs(1));
  EXPECT_THAT(d.problems[0], HasSubstr("buffer 'a'"));
  EXPECT_THAT(d.problems[0], HasSubstr("passed no fd"));
}

TEST(DecideAdoption, AnFdNoRecordNamesIsDroppedAndRaisesTheNextId)
{
  auto const state = state_of({}, 2);
  auto const n     = buffer_fd_name(9, "late");
  std::vector<stored_fd_view> fds{{9, n, sealed_memfd(4096)}};
  auto d = decide_adoption(&state, fds);
  EXPECT_THAT(d.drop_fds, ElementsAre(0u));
  ASSERT_THAT(d.problems, SizeIs(1));
  EXPECT_THAT(d.problems[0], HasSubstr("no record of the state file names it"));
  EXPECT_EQ(d.next_fd_id, 10u);

  auto without_state = decide_adoption(nullptr, fds);
  EXPECT_THAT(without_state.drop_fds, ElementsAre(0u));
  EXPECT_THAT(without_state.problems[0], HasSubstr("no usable state file"));
}

TEST(DecideAdoption, KindOrSizeMismatchesAreNeverServed)
{
  auto const state = state_of({record(1, "host"),
                               record(2, "cuda", v1::STORED_BUFFER_KIND_VMM_POSIX_FD),
                               record(3, "small"),
                               record(4, "unsealed"),
                               record(5, "closed")},
                              6);
  std::vector<std::string> names;
  for (int i = 0; i < state.buffers_size(); ++i) { names.push_back(state.buffers(i).fd_name()); }
  auto unsealed        = sealed_memfd(4096);
  unsealed.sealed_size = false;
  std::vector<stored_fd_view> fds{{1, names[0], device_fd()},
                                  {2, names[1], sealed_memfd(4096)},
                                  {3, names[2], sealed_memfd(2048)},
                                  {4, names[3], unsealed},
                                  {5, names[4], fd_facts{}}};
  auto d = decide_adoption(&state, fds);
  EXPECT_THAT(d.adopt, IsEmpty());
  EXPECT_THAT(d.drop_fds, ElementsAre(0u, 1u, 2u, 3u, 4u));
  ASSERT_THAT(d.problems, SizeIs(5));
  EXPECT_THAT(d.problems[0], HasSubstr("the fd is not a memfd"));
  EXPECT_THAT(d.problems[1], HasSubstr("the fd is a memfd"));
  EXPECT_THAT(d.problems[2], HasSubstr("the memfd has 2048 bytes, the record 4096"));
  EXPECT_THAT(d.problems[3], HasSubstr("not sealed"));
  EXPECT_THAT(d.problems[4], HasSubstr("fstat failed"));
}

TEST(DecideAdoption, TwoFdsOfOneNameAreBothDropped)
{
  auto const state = state_of({record(1, "a")}, 2);
  auto const n     = buffer_fd_name(1, "a");
  std::vector<stored_fd_view> fds{{1, n, sealed_memfd(4096)}, {1, n, sealed_memfd(4096)}};
  auto d = decide_adoption(&state, fds);
  EXPECT_THAT(d.adopt, IsEmpty());
  EXPECT_THAT(d.drop_fds, ElementsAre(0u, 1u));
  ASSERT_THAT(d.problems, SizeIs(1));
  EXPECT_THAT(d.problems[0], HasSubstr("2 fds of that name"));
}

v1::StoredBackup backup(std::uint64_t fd_id, std::string const& name, std::uint64_t bytes = 8192)
{
  v1::StoredBackup b;
  b.set_fd_id(fd_id);
  b.set_fd_name(backup_fd_name(fd_id, name));
  b.set_backup_name(name);
  b.set_uid(1000);
  b.set_tag("weights");
  b.set_size(bytes);
  b.set_allocation_bytes(bytes);
  b.set_backup_bytes(bytes);
  b.set_pool_name("gpu0");
  b.set_host_pool_name("host");
  return b;
}

TEST(DecideAdoption, BackupsAreAdoptedBesideBuffersByTheSameRule)
{
  auto state           = state_of({record(1, "weights")}, 6);
  *state.add_backups() = backup(2, "engine-0");
  *state.add_backups() = backup(3, "engine-0");  // its fd did not come back
  *state.add_backups() = backup(4, "engine-1");  // its fd has the wrong size
  *state.add_backups() = backup(5, "engine-2");  // its fd is not a memfd
  std::vector<stored_fd_view> fds{{1, state.buffers(0).fd_name(), sealed_memfd(4096)},
                                  {2, state.backups(0).fd_name(), sealed_memfd(8192)},
                                  {4, state.backups(2).fd_name(), sealed_memfd(4096)},
                                  {5, state.backups(3).fd_name(), device_fd()}};
  auto d = decide_adoption(&state, fds);
  EXPECT_THAT(d.adopt, ElementsAre(std::pair<std::size_t, std::size_t>{0, 0}));
  EXPECT_THAT(d.adopt_backups, ElementsAre(std::pair<std::size_t, std::size_t>{0, 1}));
  EXPECT_THAT(d.drop_backup_records, ElementsAre(1u, 2u, 3u));
  EXPECT_THAT(d.drop_records, IsEmpty());
  EXPECT_THAT(d.drop_fds, ElementsAre(2u, 3u));
  ASSERT_THAT(d.problems, SizeIs(3));
  EXPECT_THAT(d.problems[0], HasSubstr("backup 'engine-0' of uid 1000"));
  EXPECT_THAT(d.problems[0], HasSubstr("passed no fd for it, so its memory is gone: not kept"));
  EXPECT_THAT(d.problems[1], HasSubstr("the memfd has 4096 bytes, the record 8192: not kept"));
  EXPECT_THAT(d.problems[2], HasSubstr("the fd is not a memfd"));
}

int sealed_memfd_of(std::size_t bytes)
{
  int fd = ::memfd_create("adoption-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  return fd;
}

TEST(InspectFd, TellsMemfdsSealsAndSizes)
{
  owned_fd memfd(sealed_memfd_of(8192));
  auto facts = inspect_fd(memfd.get());
  EXPECT_TRUE(facts.open && facts.memfd && facts.sealed_size);
  EXPECT_EQ(facts.bytes, 8192u);

  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  owned_fd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  facts = inspect_fd(read_end.get());
  EXPECT_TRUE(facts.open);
  EXPECT_FALSE(facts.memfd);

  EXPECT_FALSE(inspect_fd(-1).open);
}

TEST(Reconcile, AdoptsRealMemfdsAndClosesWhatItDrops)
{
  auto const state = state_of({record(1, "keep"), record(2, "gone")}, 3);
  std::vector<passed_stored_fd> fds;
  fds.push_back({1, buffer_fd_name(1, "keep"), owned_fd(sealed_memfd_of(4096))});
  int const stray = sealed_memfd_of(4096);
  fds.push_back({7, buffer_fd_name(7, "stray"), owned_fd(stray)});
  auto r = reconcile(state, std::move(fds));
  ASSERT_THAT(r.adopted, SizeIs(1));
  EXPECT_EQ(r.adopted[0].record.name(), "keep");
  EXPECT_TRUE(inspect_fd(r.adopted[0].fd.get()).memfd);
  EXPECT_THAT(r.remove_from_store, ElementsAre(buffer_fd_name(7, "stray")));
  EXPECT_THAT(r.problems, SizeIs(2));
  EXPECT_EQ(r.next_fd_id, 8u);
  // The stray fd was closed: its number is free again (or reused by another open).
  EXPECT_EQ(::fcntl(stray, F_GETFD), -1);
}

TEST(Reconcile, HandsBackupsBackWithTheirMemfds)
{
  auto state           = state_of({}, 3);
  *state.add_backups() = backup(2, "engine-0");
  std::vector<passed_stored_fd> fds;
  fds.push_back({2, backup_fd_name(2, "engine-0"), owned_fd(sealed_memfd_of(8192))});
  auto r = reconcile(state, std::move(fds));
  EXPECT_THAT(r.adopted, IsEmpty());
  ASSERT_THAT(r.adopted_backups, SizeIs(1));
  EXPECT_EQ(r.adopted_backups[0].record.backup_name(), "engine-0");
  EXPECT_EQ(inspect_fd(r.adopted_backups[0].fd.get()).bytes, 8192u);
  EXPECT_THAT(r.problems, IsEmpty());
}

}  // namespace
}  // namespace rmmd::restart
