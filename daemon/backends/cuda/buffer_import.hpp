#pragma once

// A shared buffer's allocation taken back from its POSIX fd, after a restart
// of rmmd (daemon/restart: the fd came back from systemd's fd store). The
// allocation was made by cuda_backend::allocate_shared (cuMemCreate,
// exported as a POSIX fd, and as a fabric handle where its pool had them);
// cuMemImportFromShareableHandle gives this process a handle to it again.

#include "daemon/core/pool_backend.hpp"

#include <absl/status/statusor.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace rmmd::backends::cuda {

struct imported_buffer {
  core::shared_allocation memory;
  /// memory.fabric_handle is the one the state file recorded (the driver
  /// exports none from an allocation imported by POSIX fd, and imported the
  /// recorded bytes): processes get the handle the buffer was published with.
  bool recorded_fabric{false};
  /// Set when the buffer had a fabric handle and cannot have one now (said
  /// in words): it is served by its POSIX fd only.
  std::string fabric_note;
};

/// Imports the allocation behind `fd` on `device` (the daemon's ordinal)
/// and checks it: a device allocation of that device, exportable as a POSIX
/// fd, of at least `allocation_bytes` (the record's; it maps that many
/// bytes once and unmaps them). With `fabric`, the buffer gets a fabric
/// handle too: one exported from the imported allocation where the driver
/// allows it, else `recorded_fabric` (the handle the creating daemon
/// exported, from the state file) where the driver imports those bytes, a
/// sign the handle still names a live allocation (the import is released at
/// once); `fabric_note` says why neither held. The result owns `fd` on
/// success (memory.fd); on error `fd` is left to the caller. Errors say what
/// did not hold, in words.
[[nodiscard]] absl::StatusOr<imported_buffer> import_buffer(int device,
                                                            int fd,
                                                            std::size_t allocation_bytes,
                                                            bool fabric,
                                                            std::string_view recorded_fabric);

/// Frees an allocation of its own on `device`, what import_buffer gave or
/// the cuda backend made: closes its fd and releases the daemon's handle
/// (importers keep theirs until they release them).
void release_own(int device, core::shared_allocation const& memory) noexcept;

}  // namespace rmmd::backends::cuda
