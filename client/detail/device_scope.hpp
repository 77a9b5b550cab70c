#pragma once

// Making a device current for a scope. RMM's cuda_set_device_raii does the
// same but throws from its constructor when the current device cannot be
// read, and always restores: the session's reader thread must not (its
// "previous" device is the default 0, and making 0 current creates a context
// there, in a process that may never use GPU 0).

#include <cuda_runtime_api.h>

namespace rmmd::detail {

/// Makes `device` current while it lives, where it is not already, and the
/// previous one current again afterwards unless told to keep `device`. When
/// the current device cannot be read it still switches, and restores nothing.
class device_scope {
 public:
  enum class afterwards : bool { restore, keep };

  explicit device_scope(int device, afterwards then = afterwards::restore) noexcept
  {
    bool const known = cudaGetDevice(&previous_) == cudaSuccess;
    if (!known) { cudaGetLastError(); }
    if (known && previous_ == device) { return; }
    error_ = cudaSetDevice(device);
    if (error_ != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    restore_ = known && then == afterwards::restore;
  }
  device_scope(device_scope const&)            = delete;
  device_scope& operator=(device_scope const&) = delete;
  ~device_scope()
  {
    if (restore_ && cudaSetDevice(previous_) != cudaSuccess) { cudaGetLastError(); }
  }

  /// cudaSuccess, or why `device` could not be made current.
  [[nodiscard]] cudaError_t error() const noexcept
  {
    return error_;
  }

 private:
  int previous_{};
  cudaError_t error_{cudaSuccess};
  bool restore_{};
};

}  // namespace rmmd::detail
