#pragma once

// Page-locking host memory (cudaHostRegister) and undoing it are CUDA calls
// that need a context. In a process without one, the runtime makes the
// current device's primary context for the call: about 520 MiB of that
// GPU's memory (GPU 0 unless the process chose another), in a process that
// may never use CUDA otherwise (a CPU-side reader of a host buffer). This
// finds a context the process has already, so that such calls make none.

#include <cuda.h>

namespace rmmd::detail {

/// While it lives, a context of this process is current on the calling
/// thread where the process has one: the thread's own current context, or
/// else the primary context of the lowest device where it is active
/// (retained and pushed, then popped and released). Makes no context.
class existing_context {
 public:
  existing_context() noexcept;
  existing_context(existing_context const&)            = delete;
  existing_context& operator=(existing_context const&) = delete;
  ~existing_context();

  /// Whether a context is current now (false: the process has none on any
  /// device, or the driver cannot say).
  [[nodiscard]] explicit operator bool() const noexcept
  {
    return found_;
  }

 private:
  bool found_{false};
  bool pushed_{false};
  CUdevice device_{};
};

}  // namespace rmmd::detail
