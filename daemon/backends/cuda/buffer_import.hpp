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

namespace rmmd::backends::cuda {

struct imported_buffer {
  core::shared_allocation memory;
  /// Set when the buffer had a fabric handle and cannot have one now (said
  /// in words): it is served by its POSIX fd only.
  std::string fabric_note;
};

/// Imports the allocation behind `fd` on `device` (the daemon's ordinal)
/// and checks it: a device allocation of that device, exportable as a POSIX
/// fd, of at least `allocation_bytes` (the record's; it maps that many
/// bytes once and unmaps them). With `fabric`, also exports a fabric handle
/// where the allocation allows one (`fabric_note` otherwise). The result
/// owns `fd` on success (memory.fd); on error `fd` is left to the caller.
/// Errors say what did not hold, in words.
[[nodiscard]] absl::StatusOr<imported_buffer> import_buffer(int device,
                                                            int fd,
                                                            std::size_t allocation_bytes,
                                                            bool fabric);

/// Frees what import_buffer gave (closes the fd, releases the handle).
void release_imported(int device, core::shared_allocation const& memory) noexcept;

}  // namespace rmmd::backends::cuda
