#pragma once

// The fabric probe of peering (docs/operations.md, "Across nodes"): a small
// allocation a daemon exports by fabric handle so that a daemon on another
// node proves it can import and read it, and the import of the other's.
//
// Only on a GPU whose pool fabric_probe.hpp proved exports fabric handles:
// a failed fabric export followed by the destruction of what it came from
// kills the process (DESIGN.md).
//
// Thread safety: a fabric_probe_allocation is made and destroyed on one
// thread and only read between; import_fabric_probe may run on any thread.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rmmd::backends::cuda {

/// One granule of device memory with a fabric handle, every 8-byte word of
/// it holding a random pattern. Released when destroyed.
class fabric_probe_allocation {
 public:
  /// On `device` (the daemon's CUDA ordinal). Throws std::runtime_error with
  /// the CUDA call and error name when it cannot be made.
  explicit fabric_probe_allocation(int device);
  fabric_probe_allocation(fabric_probe_allocation const&)            = delete;
  fabric_probe_allocation& operator=(fabric_probe_allocation const&) = delete;
  ~fabric_probe_allocation();

  [[nodiscard]] std::vector<std::byte> const& fabric_handle() const noexcept
  {
    return handle_;
  }
  [[nodiscard]] std::uint64_t bytes() const noexcept
  {
    return bytes_;
  }
  [[nodiscard]] std::uint64_t pattern() const noexcept
  {
    return pattern_;
  }

 private:
  int device_{};
  std::uint64_t driver_handle_{};
  std::uint64_t bytes_{};
  std::uint64_t pattern_{};
  std::vector<std::byte> handle_;
};

/// Imports another node's probe on `device`, maps it, reads its first word
/// back and lets go of it all. Returns "" when the word is `pattern`, else
/// why not in words an operator can act on (no IMEX channel, not the same
/// NVLink domain or IMEX not running, the CUDA error's name).
std::string import_fabric_probe(int device,
                                std::vector<std::byte> const& fabric_handle,
                                std::uint64_t bytes,
                                std::uint64_t pattern);

}  // namespace rmmd::backends::cuda
