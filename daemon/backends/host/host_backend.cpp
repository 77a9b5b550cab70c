#include "daemon/backends/host/host_backend.hpp"

#include <absl/strings/str_format.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace rmmd::backends::host {
namespace {

constexpr std::size_t granularity = 256;

std::size_t page_size()
{
  return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

host_backend::host_backend(std::string const& name, std::size_t capacity)
    : ranges_(capacity, granularity)
{
  fd_ = ::memfd_create(("rmmd:" + name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd_ < 0) { throw std::system_error(errno, std::generic_category(), "memfd_create"); }
  if (::ftruncate(fd_, static_cast<off_t>(ranges_.capacity())) != 0) {
    int err = errno;
    ::close(fd_);
    throw std::system_error(err, std::generic_category(), "ftruncate of the host pool's memfd");
  }
  // Nobody may shrink the file under a client's mapping (SIGBUS), and the
  // seals themselves are final.
  if (::fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    int err = errno;
    ::close(fd_);
    throw std::system_error(err, std::generic_category(), "sealing the host pool's memfd");
  }
}

host_backend::~host_backend()
{
  ::close(fd_);
}

std::size_t host_backend::capacity() const noexcept
{
  return ranges_.capacity();
}

absl::StatusOr<core::backend_allocation> host_backend::allocate(std::size_t bytes,
                                                                std::size_t alignment)
{
  auto r = ranges_.allocate(bytes, alignment);
  if (!r) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "no free range of %d bytes aligned to %d (%d of %d bytes free: the pool is full or "
        "fragmented); free memory first",
        bytes,
        alignment,
        ranges_.free_bytes(),
        ranges_.capacity()));
  }
  return core::backend_allocation{.bytes = r->size, .offset = r->offset};
}

void host_backend::deallocate(core::backend_allocation const& block) noexcept
{
  ranges_.release({.offset = block.offset, .size = block.bytes});
  // Give the whole pages inside the range back to the kernel: an idle pool
  // costs no RAM, and the next holder of those pages reads zeros. Partial
  // pages at either end are shared with neighbours and keep their bytes.
  auto const page  = page_size();
  auto const begin = (block.offset + page - 1) / page * page;
  auto const end   = (block.offset + block.bytes) / page * page;
  if (end > begin) {
    ::fallocate(fd_,
                FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(begin),
                static_cast<off_t>(end - begin));
  }
}

}  // namespace rmmd::backends::host
