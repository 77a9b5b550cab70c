// The allocate function of use_rmmd_as_allocator(), built on the node by
// rmmd.allocators.torch against the PyTorch that runs there.
//
// PyTorch's CUDAPluggableAllocator does not check the pointer an allocate
// function returns, and maps only its own C++ type, c10::OutOfMemoryError,
// to torch.OutOfMemoryError. That type lives in libc10, so only code
// compiled against this PyTorch's headers can throw it: this file, a few
// lines over librmmd_c.so's rmmd_torch_allocate. Self-contained (no rmmd
// header) so that it builds wherever the Python package is installed.
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" {
int rmmd_torch_allocate(std::size_t size, int device, void* stream, void** ptr);
char const* rmmd_last_error_message();
}

namespace {
constexpr int rmmd_success             = 0;  // RMMD_SUCCESS
constexpr int rmmd_error_out_of_memory = 8;  // RMMD_ERROR_OUT_OF_MEMORY
}  // namespace

extern "C" __attribute__((visibility("default"))) void* rmmd_torch_malloc_oom(std::size_t size,
                                                                              int device,
                                                                              void* stream)
{
  void* ptr        = nullptr;
  int const status = rmmd_torch_allocate(size, device, stream, &ptr);
  if (status == rmmd_success) { return ptr; }
  c10::SourceLocation const where{__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)};
  std::string message = rmmd_last_error_message();
  if (status == rmmd_error_out_of_memory) {
    throw c10::OutOfMemoryError(where, std::move(message));
  }
  throw c10::Error(where, std::move(message));
}
