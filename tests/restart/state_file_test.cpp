#include "daemon/restart/state_file.hpp"

#include "daemon/restart/detail/crc32c.hpp"
#include "daemon/restart/fd_store.hpp"
#include "daemon/restart/fd_store_keeper.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

namespace rmmd::restart {
namespace {

using ::testing::HasSubstr;

v1::StoredBuffer host_record(std::uint64_t fd_id, std::string const& name)
{
  v1::StoredBuffer b;
  b.set_fd_id(fd_id);
  b.set_fd_name(buffer_fd_name(fd_id, name));
  b.set_name(name);
  b.set_size(1000);
  b.set_allocation_bytes(4096);
  b.set_pool_name("host");
  b.set_kind(v1::STORED_BUFFER_KIND_HOST_MEMFD);
  b.set_creator_uid(1000);
  b.set_creator_pid(42);
  b.set_persistent(true);
  b.set_state(v1::BUFFER_STATE_PUBLISHED);
  b.set_created_unix_ms(1'700'000'000'000);
  return b;
}

v1::StoredBackup backup_record(std::uint64_t fd_id, std::string const& name)
{
  v1::StoredBackup b;
  b.set_fd_id(fd_id);
  b.set_fd_name(backup_fd_name(fd_id, name));
  b.set_backup_name(name);
  b.set_uid(1000);
  b.set_gid(100);
  b.set_pid(43);
  b.set_command("engine --serve");
  b.set_tag("weights");
  b.set_size(3000);
  b.set_allocation_bytes(2 << 20);
  b.set_pool_name("gpu0");
  b.set_gpu_uuid("GPU-0123");
  b.set_host_pool_name("host");
  b.set_backup_bytes(2 << 20);
  b.set_asleep_since_unix_ms(1'700'000'000'000);
  return b;
}

/// Two buffers and, beside them, the sleep backups of one name.
v1::BufferRegistryState sample_state_with_backups()
{
  v1::BufferRegistryState s;
  s.set_format_version(state_format_version);
  s.set_next_fd_id(5);
  *s.add_buffers() = host_record(1, "team/model/layer0");
  *s.add_backups() = backup_record(3, "engine-0");
  auto second      = backup_record(4, "engine-0");
  second.set_tag("kv");
  *s.add_backups() = second;
  return s;
}

v1::BufferRegistryState sample_state()
{
  v1::BufferRegistryState s;
  s.set_format_version(state_format_version);
  s.set_daemon_generation(3);
  s.set_next_fd_id(3);
  *s.add_buffers() = host_record(1, "team/model/layer0");
  auto cuda        = host_record(2, "team/model/layer1");
  cuda.set_kind(v1::STORED_BUFFER_KIND_VMM_POSIX_FD);
  cuda.set_gpu_uuid("GPU-0123");
  cuda.set_gid(77);
  auto* label = cuda.mutable_manifest()->add_labels();
  label->set_key("model");
  label->set_value("llama");
  *s.add_buffers() = cuda;
  return s;
}

class StateFile : public ::testing::Test {
 protected:
  void SetUp() override
  {
    char tmpl[] = "/tmp/rmmd-state-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override
  {
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path file() const
  {
    return dir_ / "buffers.state";
  }
  void write_raw(std::string const& bytes) const
  {
    std::ofstream(file(), std::ios::binary) << bytes;
  }
  std::filesystem::path dir_;
};

TEST(Crc32c, KnownVector)
{
  EXPECT_EQ(detail::crc32c("123456789"), 0xe3069283u);
  EXPECT_EQ(detail::crc32c(""), 0u);
}

TEST_F(StateFile, MissingFileIsNoState)
{
  auto r = read_state_file(file());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_value());
}

TEST_F(StateFile, WrittenStateReadsBackWholeWithMode0600AndNoTemporaryLeft)
{
  auto const state = sample_state();
  ASSERT_TRUE(write_state_file(file(), state).ok());
  auto r = read_state_file(file());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->SerializeAsString(), state.SerializeAsString());
  struct stat st {};
  ASSERT_EQ(::stat(file().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), {}), 1);

  // A second write replaces the first.
  auto smaller = state;
  smaller.mutable_buffers()->RemoveLast();
  ASSERT_TRUE(write_state_file(file(), smaller).ok());
  r = read_state_file(file());
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->buffers_size(), 1);
}

TEST_F(StateFile, AFabricBuffersRecordKeepsItsHandleBytesThroughTheFile)
{
  // The 64 bytes of a CUmemFabricHandle, zero bytes included: the next
  // daemon hands them to clients again (the driver exports no fabric handle
  // from an allocation imported by POSIX fd).
  std::vector<std::byte> handle(64);
  for (std::size_t i = 0; i < handle.size(); ++i) {
    handle[i] = static_cast<std::byte>((i * 37) % 256);
  }
  core::kept_buffer fabric{.fd = -1, .fabric_handle = handle, .allocation_bytes = 2 << 20};
  fabric.info.name      = "team/gpu-weights";
  fabric.info.size      = 1000;
  fabric.info.pool_name = "gpu0";
  fabric.gpu_uuid       = "GPU-0123";
  auto record           = stored_record(fabric);
  record.set_fd_id(1);
  record.set_fd_name(buffer_fd_name(1, "team/gpu-weights"));
  core::kept_buffer posix = fabric;
  posix.fabric_handle.clear();
  auto plain = stored_record(posix);
  EXPECT_FALSE(plain.fabric());
  EXPECT_TRUE(plain.fabric_handle().empty());

  v1::BufferRegistryState state;
  state.set_format_version(state_format_version);
  state.set_next_fd_id(2);
  *state.add_buffers() = record;
  ASSERT_TRUE(write_state_file(file(), state).ok());
  auto r = read_state_file(file());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  ASSERT_EQ((*r)->buffers_size(), 1);
  auto const& back = (*r)->buffers(0);
  EXPECT_TRUE(back.fabric());
  ASSERT_EQ(back.fabric_handle().size(), 64u);
  EXPECT_EQ(std::memcmp(back.fabric_handle().data(), handle.data(), 64), 0);
}

TEST_F(StateFile, AnInvalidStateIsNotWrittenAndTheOldFileStays)
{
  ASSERT_TRUE(write_state_file(file(), sample_state()).ok());
  auto bad = sample_state();
  bad.mutable_buffers(1)->set_name("team/model/layer0");  // a duplicate name
  auto s = write_state_file(file(), bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("another record has its name"));
  auto r = read_state_file(file());
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->SerializeAsString(), sample_state().SerializeAsString());
}

TEST_F(StateFile, AWriteIntoAMissingDirectorySaysWhere)
{
  auto s = write_state_file(dir_ / "no-such-dir" / "state", sample_state());
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("no-such-dir"));
}

TEST_F(StateFile, EveryTruncationIsRefusedInWords)
{
  auto const bytes = encode_state(sample_state());
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    auto r = decode_state(std::string_view(bytes).substr(0, n));
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("truncated")) << n;
  }
  write_raw(bytes.substr(0, bytes.size() - 1));
  auto r = read_state_file(file());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(file().string()));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("truncated"));
}

TEST_F(StateFile, EveryFlippedPayloadBitIsAChecksumMismatch)
{
  auto const bytes = encode_state(sample_state());
  for (std::size_t i = state_file_header_bytes; i < bytes.size(); ++i) {
    auto copy = bytes;
    copy[i] ^= 0x10;
    auto r = decode_state(copy);
    ASSERT_FALSE(r.ok()) << i;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("checksum mismatch")) << i;
  }
}

TEST_F(StateFile, ForeignTrailingAndOversizedFilesAreRefused)
{
  auto const bytes = encode_state(sample_state());
  auto foreign     = bytes;
  foreign[0]       = 'X';
  EXPECT_THAT(std::string(decode_state(foreign).status().message()),
              HasSubstr("not an rmmd state file"));
  EXPECT_THAT(std::string(decode_state("hello").status().message()),
              HasSubstr("not an rmmd state file"));
  EXPECT_THAT(std::string(decode_state(bytes + "x").status().message()),
              HasSubstr("1 bytes follow"));
  auto huge = bytes;
  huge[15]  = 0x7f;  // the length's top byte
  EXPECT_THAT(std::string(decode_state(huge).status().message()), HasSubstr("more than"));
}

TEST_F(StateFile, APayloadThatIsNotTheMessageIsCorrupt)
{
  std::string payload = "\xff\xff\xff";
  std::string bytes(state_file_magic);
  for (int i = 0; i < 8; ++i) {
    bytes.push_back(i == 0 ? static_cast<char>(payload.size()) : '\0');
  }
  auto crc = detail::crc32c(payload);
  for (int i = 0; i < 4; ++i) { bytes.push_back(static_cast<char>((crc >> (8 * i)) & 0xff)); }
  bytes += payload;
  auto r = decode_state(bytes);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("does not parse"));
}

TEST_F(StateFile, AnotherFormatVersionIsRefused)
{
  auto state = sample_state();
  state.set_format_version(2);
  auto r = decode_state(encode_state(state));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("format version 2"));
}

TEST(StateProblem, EachRuleNamesTheRecord)
{
  auto check = [](auto change, char const* expected) {
    auto state = sample_state();
    change(*state.mutable_buffers(1));
    auto why = state_problem(state);
    ASSERT_TRUE(why.has_value()) << expected;
    EXPECT_THAT(*why, HasSubstr("record 1")) << expected;
    EXPECT_THAT(*why, HasSubstr(expected));
  };
  check([](v1::StoredBuffer& b) { b.set_fd_name("a:b"); }, "fd name is not one systemd gives");
  check([](v1::StoredBuffer& b) { b.set_fd_name("rmmd-buffer-9.x"); }, "does not carry its fd_id");
  check(
      [](v1::StoredBuffer& b) {
        b.set_fd_id(7);
        b.set_fd_name(buffer_fd_name(7, "x"));
      },
      "not below next_fd_id");
  check([](v1::StoredBuffer& b) { b.set_name("/abs"); }, "buffer name");
  check([](v1::StoredBuffer& b) { b.set_size(0); }, "size is 0");
  check([](v1::StoredBuffer& b) { b.set_allocation_bytes(10); }, "smaller than its size");
  check([](v1::StoredBuffer& b) { b.set_kind(v1::STORED_BUFFER_KIND_UNSPECIFIED); }, "kind 0");
  check([](v1::StoredBuffer& b) { b.clear_gpu_uuid(); }, "without a GPU UUID");
  check([](v1::StoredBuffer& b) { b.set_state(v1::BUFFER_STATE_WRITING); }, "not PUBLISHED");
  check(
      [](v1::StoredBuffer& b) {
        b.set_fd_id(1);
        b.set_fd_name(buffer_fd_name(1, "other"));
      },
      "another record has its fd");
  EXPECT_FALSE(state_problem(sample_state()).has_value());
}

TEST(StateProblem, EachBackupRuleNamesTheBackupRecord)
{
  auto check = [](auto change, char const* expected) {
    auto state = sample_state_with_backups();
    change(*state.mutable_backups(1));
    auto why = state_problem(state);
    ASSERT_TRUE(why.has_value()) << expected;
    EXPECT_THAT(*why, HasSubstr("backup record 1 (backup '")) << expected;
    EXPECT_THAT(*why, HasSubstr("' of uid 1000): ")) << expected;
    EXPECT_THAT(*why, HasSubstr(expected));
  };
  using b = v1::StoredBackup;
  check([](b& r) { r.set_fd_name("a:b"); }, "fd name is not one systemd gives");
  check([](b& r) { r.set_fd_name(buffer_fd_name(4, "engine-0")); }, "is not a backup's");
  check(
      [](b& r) {
        r.set_fd_id(9);
        r.set_fd_name(backup_fd_name(9, "engine-0"));
      },
      "not below next_fd_id");
  check([](b& r) { r.set_backup_name("../x"); }, "backup name");
  check([](b& r) { r.set_tag(""); }, "its tag");
  check([](b& r) { r.set_size(0); }, "size is 0");
  check([](b& r) { r.set_allocation_bytes(10); }, "sizes do not fit");
  check([](b& r) { r.set_backup_bytes(4096); }, "sizes do not fit");
  check([](b& r) { r.clear_host_pool_name(); }, "no host pool");
  check(
      [](b& r) {
        r.set_fd_id(1);  // the buffer's
        r.set_fd_name(backup_fd_name(1, "engine-0"));
      },
      "another record has its fd_id 1");
  check(
      [](b& r) {
        r.set_fd_id(3);
        r.set_fd_name(backup_fd_name(3, "engine-0"));
      },
      "another record has its fd name");
  EXPECT_FALSE(state_problem(sample_state_with_backups()).has_value());
}

TEST_F(StateFile, BackupsReadBackWholeBesideTheBuffers)
{
  auto const state = sample_state_with_backups();
  ASSERT_TRUE(write_state_file(file(), state).ok());
  auto read = read_state_file(file());
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->has_value());
  EXPECT_EQ((*read)->SerializeAsString(), state.SerializeAsString());
  EXPECT_EQ((*read)->backups_size(), 2);
  EXPECT_EQ((*read)->backups(1).tag(), "kv");
}

TEST(StoredRecord, ABackupsRecordCarriesWhatARestoreNeeds)
{
  auto const since = std::chrono::system_clock::time_point(std::chrono::milliseconds(1234567));
  auto r           = stored_record(core::kept_backup{.id             = 5,
                                                     .uid            = 1000,
                                                     .gid            = 100,
                                                     .pid            = 42,
                                                     .command        = "engine",
                                                     .backup_name    = "engine-0",
                                                     .tag            = "weights",
                                                     .size           = 3000,
                                                     .bytes          = 2 << 20,
                                                     .pool_name      = "gpu0",
                                                     .gpu_uuid       = "GPU-1",
                                                     .host_pool_name = "host",
                                                     .fd             = -1,
                                                     .backup_bytes   = 2 << 20,
                                                     .asleep_since   = since});
  EXPECT_EQ(r.backup_name(), "engine-0");
  EXPECT_EQ(r.uid(), 1000u);
  EXPECT_EQ(r.gid(), 100u);
  EXPECT_EQ(r.pid(), 42);
  EXPECT_EQ(r.command(), "engine");
  EXPECT_EQ(r.tag(), "weights");
  EXPECT_EQ(r.size(), 3000u);
  EXPECT_EQ(r.allocation_bytes(), 2u << 20);
  EXPECT_EQ(r.pool_name(), "gpu0");
  EXPECT_EQ(r.gpu_uuid(), "GPU-1");
  EXPECT_EQ(r.host_pool_name(), "host");
  EXPECT_EQ(r.backup_bytes(), 2u << 20);
  EXPECT_EQ(r.asleep_since_unix_ms(), 1234567);
  EXPECT_TRUE(r.fd_name().empty());  // the keeper's to set
}

}  // namespace
}  // namespace rmmd::restart
