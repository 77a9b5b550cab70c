#pragma once

// systemd's file-descriptor store, as rmmd uses it to keep published
// buffers (and named sleep backups) alive across its own restart and crash:
// each buffer's shareable fd
// goes to the service manager (sd_pid_notify_with_fds, "FDSTORE=1"), comes
// back at the next start (LISTEN_FDS / LISTEN_FDNAMES, sd_listen_fds(3)),
// and leaves the store when the buffer is deleted ("FDSTOREREMOVE=1").
// The store holds a dup of the fd: the memory stays alive while either the
// daemon or the store holds one.
//
// Fd names. An FDNAME is at most 255 bytes of printable ASCII without ':',
// and systemd does not make names unique (FDSTOREREMOVE drops every fd of a
// name). A buffer's fd is stored as "rmmd-buffer-<fd_id>.<buffer name>":
// fd_id is a number the registry gives once (BufferRegistryState.next_fd_id,
// proto/rmmd/v1/state.proto), which makes the name unique even when a buffer
// is deleted and a new one takes its name; the buffer name after the dot is
// for the operator (`systemd-analyze fdstore rmmd`) and is cut to fit 255
// bytes. Buffer names are FDNAME-safe as they are ([A-Za-z0-9._/-],
// common/buffer_name.hpp); a character that is not (a name the rule would
// refuse) becomes '_'. The name is not reversed: the state file's record
// (StoredBuffer.fd_name) says which buffer an fd is; only fd_id is read back.
// A sleep backup's memfd is stored as "rmmd-backup-<fd_id>.<backup name>",
// its fd_id from the same count. Any fd whose name starts with neither
// prefix (a socket a .socket unit passes, an fd stored without FDNAME, which
// systemd calls "stored") is not rmmd's: take_passed_fds() hands it back as
// `other`.
//
// Without systemd (no NOTIFY_SOCKET: a test, a container, rmmd started by
// hand) storing and removing do nothing, and the first call says so once in
// the log; available() tells.
//
// Thread safety: store() and remove() may be called from any thread (each is
// one datagram); take_passed_fds() once, at start, before other threads run
// (it reads and unsets the process's environment).

#include <absl/status/status.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd::restart {

/// The prefix of every buffer fd's FDNAME.
inline constexpr std::string_view buffer_fd_name_prefix = "rmmd-buffer-";
/// The prefix of every sleep backup fd's FDNAME.
inline constexpr std::string_view backup_fd_name_prefix = "rmmd-backup-";
/// systemd's limit on an FDNAME.
inline constexpr std::size_t max_fd_name_bytes = 255;

/// "rmmd-buffer-<fd_id>.<buffer_name>", cut to 255 bytes, any byte outside
/// printable ASCII or ':' replaced by '_'.
[[nodiscard]] std::string buffer_fd_name(std::uint64_t fd_id, std::string_view buffer_name);

/// The fd_id of a buffer fd's name; nullopt for a name that is not one
/// (no prefix, no digits, digits not followed by '.' or the end, overflow).
[[nodiscard]] std::optional<std::uint64_t> buffer_fd_id(std::string_view fd_name);

/// "rmmd-backup-<fd_id>.<backup_name>", made as buffer_fd_name() makes one.
[[nodiscard]] std::string backup_fd_name(std::uint64_t fd_id, std::string_view backup_name);
/// The fd_id of a backup fd's name, as buffer_fd_id() reads one.
[[nodiscard]] std::optional<std::uint64_t> backup_fd_id(std::string_view fd_name);

/// The fd_id of a buffer's or a backup's fd name (an fd rmmd stored).
[[nodiscard]] std::optional<std::uint64_t> stored_fd_id(std::string_view fd_name);

/// True if `fd_name` is valid as an FDNAME (systemd's fdname_is_valid).
[[nodiscard]] bool is_valid_fd_name(std::string_view fd_name);

/// An fd this process owns, closed on destruction. Move-only.
class owned_fd {
 public:
  owned_fd() = default;
  explicit owned_fd(int fd) noexcept : fd_(fd) {}
  owned_fd(owned_fd&& other) noexcept : fd_(other.release()) {}
  owned_fd& operator=(owned_fd&& other) noexcept;
  owned_fd(owned_fd const&)            = delete;
  owned_fd& operator=(owned_fd const&) = delete;
  ~owned_fd();

  [[nodiscard]] int get() const noexcept
  {
    return fd_;
  }
  [[nodiscard]] explicit operator bool() const noexcept
  {
    return fd_ >= 0;
  }
  /// Gives the fd up without closing it.
  int release() noexcept;

 private:
  int fd_{-1};
};

/// One fd the service manager passed at start.
struct passed_fd {
  std::string name;  // its LISTEN_FDNAMES entry ("unknown" if none was given)
  owned_fd fd;
};

/// A passed fd that rmmd stored: a buffer's or a backup's (its name parses
/// as buffer_fd_name() or backup_fd_name()).
struct passed_stored_fd {
  std::uint64_t fd_id{};
  std::string name;
  owned_fd fd;
};

/// What the service manager passed at start, split by name.
struct passed_fds {
  std::vector<passed_stored_fd> stored;
  /// Everything else, in the order passed: sockets of a .socket unit, and
  /// fds stored under names rmmd does not know (an older or newer rmmd's):
  /// the caller uses or closes them, and removes unknown stored ones from
  /// the store (fd_store::remove) so that they do not come back forever.
  std::vector<passed_fd> others;
};

/// Takes the fds passed to this process (sd_listen_fds_with_names: checks
/// LISTEN_PID, unsets LISTEN_FDS, LISTEN_PID and LISTEN_FDNAMES, marks each
/// fd close-on-exec) and splits them. Without LISTEN_FDS: both lists empty.
/// Never throws; an environment systemd would not write (LISTEN_FDNAMES of
/// the wrong count) is logged and its fds are returned as `others` named
/// "unknown".
[[nodiscard]] passed_fds take_passed_fds();

class fd_store {
 public:
  /// Reads NOTIFY_SOCKET now: available() is whether it is set.
  fd_store();

  fd_store(fd_store const&)            = delete;
  fd_store& operator=(fd_store const&) = delete;
  virtual ~fd_store()                  = default;

  /// True where a service manager listens (NOTIFY_SOCKET is set). Whether
  /// it keeps the fds also needs FileDescriptorStoreMax= > 0 in the unit,
  /// which a service cannot see: systemd drops an fd past the limit with a
  /// line in its own log and nothing to the sender.
  [[nodiscard]] bool available() const noexcept
  {
    return available_;
  }

  /// Sends "FDSTORE=1\nFDNAME=<fd_name>\nFDPOLL=0" with a dup of `fd`
  /// (FDPOLL=0: memfds and CUDA's fds are kept even if they ever poll as
  /// hung up). OK without systemd (nothing sent; logged once). Error: a name
  /// systemd would refuse (nothing sent), or the send failed (errno in
  /// words). REQUIRES: fd >= 0.
  virtual absl::Status store(std::string_view fd_name, int fd);

  /// Sends "FDSTOREREMOVE=1\nFDNAME=<fd_name>": the store closes every fd of
  /// that name. OK without systemd (nothing sent; logged once).
  virtual absl::Status remove(std::string_view fd_name);

 protected:
  /// A stand-in for the service manager (tests): available() as given,
  /// NOTIFY_SOCKET not read; it overrides store() and remove().
  explicit fd_store(bool available) : available_(available) {}

 private:
  absl::Status send(std::string const& message, int const* fds, unsigned n_fds);
  void say_unavailable_once();

  bool available_{false};
  std::atomic<bool> said_unavailable_{false};
};

}  // namespace rmmd::restart
