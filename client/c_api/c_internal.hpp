#pragma once

// Private to librmmd_c: what its files (one per domain of include/rmmd/rmmd.h:
// c_errors, c_session, c_resources, c_buffers, c_peers, c_stable, c_allocators) share:
// the opaque handles' definitions, and how an exported function turns an
// exception into a status and the thread's message (STYLE.md: nothing throws
// across the ABI). Nothing here is exported (the library's symbols are
// hidden but for rmmd_c.map's).

#include <rmmd/rmmd.h>
#include <rmmd/host_memory_resource.hpp>
#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/pinned_host_memory_resource.hpp>
#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>
#include <rmmd/stable_memory_resource.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <variant>

struct rmmd_session_s {
  rmmd::session session;
};

/// A resource and what rmmd_resource_get_stats reports of it (the
/// allocations made through this handle; atomics: any thread allocates).
struct rmmd_resource_s {
  std::variant<rmmd::ipc_memory_resource,
               rmmd::host_memory_resource,
               rmmd::pinned_host_memory_resource>
      mr;
  int device{-1};
  std::atomic<std::uint64_t> allocated{};
  std::atomic<std::uint64_t> count{};
  std::atomic<std::uint64_t> high_water{};
  std::atomic<std::uint64_t> total{};
};

/// One handle on a stable resource (a copyable handle itself: the
/// process-wide ones of c_allocators hand out copies).
struct rmmd_stable_resource_s {
  rmmd::stable_memory_resource mr;
};

struct rmmd_buffer_s {
  rmmd::shared_buffer buffer;
  int device{-1};
};

namespace rmmd::c_api {

/// Sets the calling thread's message (rmmd_last_error_message); `status`.
rmmd_status fail(rmmd_status status, std::string message);

/// The status and message of the exception in flight (DESIGN.md's table).
/// REQUIRES: called inside a catch block.
rmmd_status from_exception() noexcept;

/// Runs `body`, which returns nothing or throws; the status.
template <typename Body>
rmmd_status guarded(Body&& body) noexcept
{
  try {
    body();
    return RMMD_SUCCESS;
  } catch (...) {
    return from_exception();
  }
}

/// RMMD_ERROR_INVALID_ARGUMENT saying that `what` is NULL.
rmmd_status null_argument(char const* what);

/// Reads a caller's struct that begins with its size: a copy of the fields
/// the caller knows, the rest as `defaults` has them. `older_sizes`: the sizes
/// released before (a caller built against them knows the fields up to
/// there); any other size would cut a field (a pointer) in half: nullopt.
template <typename Struct>
std::optional<Struct> read_struct(Struct const* in,
                                  Struct defaults,
                                  std::initializer_list<std::size_t> older_sizes = {})
{
  if (in == nullptr) { return defaults; }
  bool const known =
      in->size == sizeof(Struct) ||
      std::find(older_sizes.begin(), older_sizes.end(), in->size) != older_sizes.end();
  if (!known) { return std::nullopt; }
  std::memcpy(&defaults, in, in->size);
  defaults.size = sizeof(Struct);
  return defaults;
}

/// A C enum field as the int its caller stored: C lets any int stand there,
/// and C++ reading a value beyond the enumerators' range as the enum is
/// undefined (UBSan says so), so it is read as bytes.
template <typename Enum>
int raw_enum(Enum const& field) noexcept
{
  static_assert(sizeof(Enum) == sizeof(int));
  int value = 0;
  std::memcpy(&value, &field, sizeof value);
  return value;
}

/// `s` in memory of malloc's, for the caller to free with rmmd_string_free.
/// Throws std::bad_alloc.
char* copy_string(std::string const& s);

/// What rmmd_resource_get_stats counts, for every allocation through a handle.
void note_allocation(rmmd_resource_s& r, std::size_t bytes) noexcept;
void note_deallocation(rmmd_resource_s& r, std::size_t bytes) noexcept;

}  // namespace rmmd::c_api
