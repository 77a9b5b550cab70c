#include "daemon/restart/state_file.hpp"

#include "common/buffer_name.hpp"
#include "daemon/core/stable_registry.hpp"
#include "daemon/restart/detail/crc32c.hpp"
#include "daemon/restart/fd_store.hpp"

#include <absl/strings/str_format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <unordered_set>
#include <utility>

namespace rmmd::restart {
namespace {

void put_le(std::string& out, std::uint64_t value, int bytes)
{
  for (int i = 0; i < bytes; ++i) { out.push_back(static_cast<char>((value >> (8 * i)) & 0xff)); }
}

std::uint64_t get_le(std::string_view in, std::size_t at, int bytes)
{
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  }
  return value;
}

std::optional<std::string> record_problem(v1::StoredBuffer const& b, std::uint64_t next_fd_id)
{
  if (!is_valid_fd_name(b.fd_name()) || b.fd_name().empty()) {
    return "its fd name is not one systemd gives (1 to 255 bytes of printable ASCII, no ':')";
  }
  auto id = buffer_fd_id(b.fd_name());
  if (!id || *id != b.fd_id()) {
    return absl::StrFormat("its fd name '%s' does not carry its fd_id %d", b.fd_name(), b.fd_id());
  }
  if (b.fd_id() >= next_fd_id) {
    return absl::StrFormat("its fd_id %d is not below next_fd_id %d", b.fd_id(), next_fd_id);
  }
  if (auto why = names::buffer_name_problem(b.name())) { return "its buffer name: " + *why; }
  if (b.size() == 0) { return std::string("its size is 0"); }
  if (b.allocation_bytes() < b.size()) {
    return absl::StrFormat(
        "its allocation (%d bytes) is smaller than its size (%d)", b.allocation_bytes(), b.size());
  }
  switch (b.kind()) {
    case v1::STORED_BUFFER_KIND_VMM_POSIX_FD:
      if (b.gpu_uuid().empty()) { return std::string("a CUDA allocation without a GPU UUID"); }
      break;
    case v1::STORED_BUFFER_KIND_HOST_MEMFD:
      if (!b.gpu_uuid().empty()) { return std::string("a host memfd with a GPU UUID"); }
      break;
    default:
      return absl::StrFormat("its kind %d is not one this rmmd knows", b.kind());
  }
  if (b.state() != v1::BUFFER_STATE_PUBLISHED) {
    return absl::StrFormat("its state %d is not PUBLISHED (only published buffers are stored)",
                           b.state());
  }
  return std::nullopt;
}

std::optional<std::string> backup_record_problem(v1::StoredBackup const& b,
                                                 std::uint64_t next_fd_id)
{
  if (!is_valid_fd_name(b.fd_name()) || b.fd_name().empty()) {
    return "its fd name is not one systemd gives (1 to 255 bytes of printable ASCII, no ':')";
  }
  auto id = backup_fd_id(b.fd_name());
  if (!id || *id != b.fd_id()) {
    return absl::StrFormat(
        "its fd name '%s' is not a backup's carrying its fd_id %d", b.fd_name(), b.fd_id());
  }
  if (b.fd_id() >= next_fd_id) {
    return absl::StrFormat("its fd_id %d is not below next_fd_id %d", b.fd_id(), next_fd_id);
  }
  if (auto why = names::buffer_name_problem(b.backup_name())) { return "its backup name: " + *why; }
  if (auto why = core::stable_tag_problem(b.tag())) { return "its tag: " + *why; }
  if (b.size() == 0) { return std::string("its size is 0"); }
  if (b.allocation_bytes() < b.size() || b.backup_bytes() < b.allocation_bytes()) {
    return absl::StrFormat(
        "its sizes do not fit (asked %d bytes, allocation %d, backup %d): each must hold the one "
        "before",
        b.size(),
        b.allocation_bytes(),
        b.backup_bytes());
  }
  if (b.pool_name().empty() || b.host_pool_name().empty()) {
    return std::string("it names no pool or no host pool");
  }
  return std::nullopt;
}

std::string errno_text(char const* step, std::filesystem::path const& path, int e)
{
  return absl::StrFormat("%s %s: %s", step, path.string(), std::strerror(e));
}

}  // namespace

std::optional<std::string> state_problem(v1::BufferRegistryState const& state)
{
  if (state.format_version() != state_format_version) {
    return absl::StrFormat("format version %d; this rmmd reads version %d",
                           state.format_version(),
                           state_format_version);
  }
  std::unordered_set<std::string> fd_names;
  std::unordered_set<std::uint64_t> fd_ids;
  std::unordered_set<std::string> names;
  for (int i = 0; i < state.buffers_size(); ++i) {
    auto const& b = state.buffers(i);
    auto where    = absl::StrFormat("record %d (buffer '%s')", i, b.name());
    if (auto why = record_problem(b, state.next_fd_id())) { return where + ": " + *why; }
    if (!fd_names.insert(b.fd_name()).second) {
      return where + ": another record has its fd name '" + b.fd_name() + "'";
    }
    if (!fd_ids.insert(b.fd_id()).second) {
      return where + absl::StrFormat(": another record has its fd_id %d", b.fd_id());
    }
    if (!names.insert(b.name()).second) { return where + ": another record has its name"; }
  }
  for (int i = 0; i < state.backups_size(); ++i) {
    auto const& b = state.backups(i);
    auto where =
        absl::StrFormat("backup record %d (backup '%s' of uid %d)", i, b.backup_name(), b.uid());
    if (auto why = backup_record_problem(b, state.next_fd_id())) { return where + ": " + *why; }
    if (!fd_names.insert(b.fd_name()).second) {
      return where + ": another record has its fd name '" + b.fd_name() + "'";
    }
    if (!fd_ids.insert(b.fd_id()).second) {
      return where + absl::StrFormat(": another record has its fd_id %d", b.fd_id());
    }
  }
  return std::nullopt;
}

std::string encode_state(v1::BufferRegistryState const& state)
{
  std::string payload;
  state.SerializeToString(&payload);
  std::string out(state_file_magic);
  put_le(out, payload.size(), 8);
  put_le(out, detail::crc32c(payload), 4);
  out += payload;
  return out;
}

absl::StatusOr<v1::BufferRegistryState> decode_state(std::string_view bytes)
{
  if (bytes.size() < state_file_header_bytes) {
    if (!bytes.empty() && !state_file_magic.starts_with(bytes.substr(0, state_file_magic.size()))) {
      return absl::InvalidArgumentError("not an rmmd state file (its first bytes are not " +
                                        std::string(state_file_magic) + ")");
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("truncated: %d bytes, shorter than the %d-byte header",
                        bytes.size(),
                        state_file_header_bytes));
  }
  if (bytes.substr(0, state_file_magic.size()) != state_file_magic) {
    return absl::InvalidArgumentError("not an rmmd state file (its first bytes are not " +
                                      std::string(state_file_magic) + ")");
  }
  auto const length = get_le(bytes, 8, 8);
  auto const stored = static_cast<std::uint32_t>(get_le(bytes, 16, 4));
  if (length > max_state_payload_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "corrupt: the header gives a payload of %d bytes, more than the %d a state file may have",
        length,
        max_state_payload_bytes));
  }
  auto const present = bytes.size() - state_file_header_bytes;
  if (present < length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "truncated: the header gives a payload of %d bytes, the file has %d", length, present));
  }
  if (present > length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("corrupt: %d bytes follow the %d-byte payload", present - length, length));
  }
  auto const payload  = bytes.substr(state_file_header_bytes);
  auto const computed = detail::crc32c(payload);
  if (computed != stored) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "corrupt: checksum mismatch (the header says %08x, the payload's CRC-32C is %08x)",
        stored,
        computed));
  }
  v1::BufferRegistryState state;
  if (!state.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::InvalidArgumentError(
        "corrupt: the payload's checksum holds but it does not parse as a BufferRegistryState");
  }
  if (auto why = state_problem(state)) { return absl::FailedPreconditionError(*why); }
  return state;
}

absl::Status write_state_file(std::filesystem::path const& path,
                              v1::BufferRegistryState const& state)
{
  if (auto why = state_problem(state)) {
    return absl::InvalidArgumentError("not writing the state file " + path.string() + ": " + *why);
  }
  auto const bytes = encode_state(state);
  auto const dir   = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::string temp = (dir / ("." + path.filename().string() + ".XXXXXX")).string();
  int fd           = ::mkostemp(temp.data(), O_CLOEXEC);  // mode 0600
  if (fd < 0) { return absl::InternalError(errno_text("cannot create a file in", dir, errno)); }
  auto fail = [&](char const* step, std::filesystem::path const& what) {
    int const e = errno;
    if (fd >= 0) { ::close(fd); }
    ::unlink(temp.c_str());
    return absl::InternalError(errno_text(step, what, e));
  };
  for (std::size_t done = 0; done < bytes.size();) {
    auto n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) { continue; }
    if (n <= 0) { return fail("cannot write", temp); }
    done += static_cast<std::size_t>(n);
  }
  if (::fchmod(fd, 0600) != 0) { return fail("cannot chmod", temp); }
  if (::fsync(fd) != 0) { return fail("cannot fsync", temp); }
  if (::close(std::exchange(fd, -1)) != 0) { return fail("cannot close", temp); }
  if (::rename(temp.c_str(), path.c_str()) != 0) { return fail("cannot rename over", path); }
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    return absl::InternalError(errno_text("written, but cannot open its directory", dir, errno));
  }
  int const synced = ::fsync(dir_fd);
  int const e      = errno;
  ::close(dir_fd);
  if (synced != 0) {
    return absl::InternalError(errno_text("written, but cannot fsync its directory", dir, e));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<v1::BufferRegistryState>> read_state_file(
    std::filesystem::path const& path)
{
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) { return std::optional<v1::BufferRegistryState>(); }
    return absl::InternalError(errno_text("cannot open the state file", path, errno));
  }
  std::string bytes;
  char chunk[65536];
  while (true) {
    auto n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) { continue; }
    if (n < 0) {
      int const e = errno;
      ::close(fd);
      return absl::InternalError(errno_text("cannot read the state file", path, e));
    }
    if (n == 0) { break; }
    bytes.append(chunk, static_cast<std::size_t>(n));
    if (bytes.size() > state_file_header_bytes + max_state_payload_bytes) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrFormat(
          "state file %s: corrupt: larger than %d bytes", path.string(), max_state_payload_bytes));
    }
  }
  ::close(fd);
  auto state = decode_state(bytes);
  if (!state.ok()) {
    return absl::Status(
        state.status().code(),
        "state file " + path.string() + ": " + std::string(state.status().message()));
  }
  return std::optional<v1::BufferRegistryState>(*std::move(state));
}

}  // namespace rmmd::restart
