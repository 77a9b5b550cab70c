#include "daemon/backends/host/host_backend.hpp"

#include "daemon/log.hpp"

#include <absl/strings/str_format.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string_view>
#include <system_error>
#include <vector>

namespace rmmd::backends::host {
namespace {

/// Every allocation starts and ends on this many bytes: RMM's alignment, and
/// small enough that rounding wastes little.
constexpr std::size_t granularity = 256;

/// memfd_create(2) refuses names longer than this (NAME_MAX less "memfd:").
constexpr std::size_t memfd_name_max = 249;

std::uint64_t page_size() noexcept
{
  static auto const size = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

constexpr std::uint64_t align_down(std::uint64_t v, std::uint64_t a)
{
  return v / a * a;
}

constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a)
{
  return align_down(v + a - 1, a);
}

/// Closes `fd` (if open) and throws, naming the pool and what failed.
[[noreturn]] void fail(int fd, std::string const& pool, int error, std::string_view what)
{
  if (fd >= 0) { ::close(fd); }
  throw std::system_error(
      error, std::generic_category(), absl::StrFormat("host pool '%s': %s", pool, what));
}

/// Writes zeros over [begin, end) of the file. False, with errno set, on failure.
bool write_zeros(int fd, std::uint64_t begin, std::uint64_t end) noexcept
{
  static constexpr std::array<char, 64 * 1024> zeros{};
  while (begin < end) {
    auto const chunk = std::min<std::uint64_t>(end - begin, zeros.size());
    auto const n     = ::pwrite(fd, zeros.data(), chunk, static_cast<off_t>(begin));
    if (n < 0 && errno == EINTR) { continue; }
    if (n <= 0) {
      if (n == 0) { errno = EIO; }
      return false;
    }
    begin += static_cast<std::uint64_t>(n);
  }
  return true;
}

}  // namespace

host_backend::host_backend(std::string const& name,
                           std::size_t capacity,
                           bool pinnable,
                           std::string const& tenant)
    : name_(name), ranges_(capacity, granularity), pinnable_(pinnable)
{
  if (ranges_.capacity() == 0) {
    fail(fd_,
         name,
         EINVAL,
         absl::StrFormat("a capacity of %d bytes is too small; give it at least %d bytes",
                         capacity,
                         granularity));
  }
  if (ranges_.capacity() > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max())) {
    fail(fd_, name, EFBIG, absl::StrFormat("a capacity of %d bytes is too large", capacity));
  }
  // The name only shows in /proc/PID/fd and /proc/PID/maps, so truncating a
  // long pool name is better than failing on it.
  auto const memfd_name =
      ("rmmd:" + name + (tenant.empty() ? "" : ":" + tenant)).substr(0, memfd_name_max);
  fd_ = ::memfd_create(memfd_name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd_ < 0) { fail(fd_, name, errno, "memfd_create failed"); }
  if (::ftruncate(fd_, static_cast<off_t>(ranges_.capacity())) != 0) {
    fail(fd_,
         name,
         errno,
         absl::StrFormat("cannot size its memfd to %d bytes (ftruncate)", ranges_.capacity()));
  }
  // Nobody may shrink the file under a client's mapping (its accesses past the
  // new end would raise SIGBUS), and the seals themselves are final.
  if (::fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    fail(fd_, name, errno, "cannot seal its memfd (fcntl F_ADD_SEALS)");
  }
}

host_backend::~host_backend()
{
  ::close(fd_);
}

absl::StatusOr<core::shared_allocation> host_backend::allocate_shared(std::size_t bytes,
                                                                      std::size_t alignment)
{
  if (alignment > page_size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("alignment %d is larger than the %d-byte pages a host buffer is mapped at",
                        alignment,
                        page_size()));
  }
  auto const size       = align_up(bytes, page_size());
  auto const memfd_name = ("rmmd:" + name_ + ":buffer").substr(0, memfd_name_max);
  int fd                = ::memfd_create(memfd_name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  auto failed           = [&](char const* what) {
    auto message = absl::StrFormat("host pool '%s': a buffer's memfd of %d bytes: %s: %s",
                                   name_,
                                   size,
                                   what,
                                   std::strerror(errno));
    if (fd >= 0) { ::close(fd); }
    return absl::InternalError(message);
  };
  if (fd < 0) { return failed("memfd_create"); }
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) { return failed("ftruncate"); }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return failed("fcntl F_ADD_SEALS");
  }
  return core::shared_allocation{.block = {.bytes = size}, .fd = fd, .host_memfd = true};
}

void host_backend::deallocate_shared(core::shared_allocation const& memory) noexcept
{
  // Holders that still map it keep its pages; nobody else is given them.
  if (memory.fd >= 0) { ::close(memory.fd); }
}

std::size_t host_backend::capacity() const noexcept
{
  return ranges_.capacity();
}

absl::StatusOr<core::backend_allocation> host_backend::allocate(std::size_t bytes,
                                                                std::size_t alignment)
{
  std::lock_guard lock(mutex_);
  auto r = ranges_.allocate(bytes, alignment);
  if (!r) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "no free range of %d bytes aligned to %d: %d of %d bytes are free, but the pool is full "
        "or too fragmented for this request; free memory first or ask for less",
        bytes,
        alignment,
        ranges_.free_bytes(),
        ranges_.capacity()));
  }
  return core::backend_allocation{.bytes = r->size, .offset = r->offset};
}

void host_backend::stop_lending() noexcept
{
  std::lock_guard lock(mutex_);
  lending_ = false;
}

void host_backend::deallocate(core::backend_allocation const& block) noexcept
{
  std::lock_guard lock(mutex_);
  auto const now_free = ranges_.release({.offset = block.offset, .size = block.bytes});
  if (pinnable_) { return; }  // clients' pinned mappings must keep these very pages
  if (!lending_) { return; }  // nobody is lent it again; a reconnected client still maps it
  clear_locked(block.offset, block.offset + block.bytes, now_free);
}

// A closing session's leases: adjacent blocks (a session's allocations made
// one after another mostly are) go back as one range, and each free range
// they end up in is cleared once, over the span of the blocks in it: at most
// one hole and two partial-page writes per range, not per block. Bytes of
// that span that were free before are zeros already, so clearing them again
// changes nothing.
void host_backend::deallocate_many(std::span<core::backend_allocation const> blocks) noexcept
{
  if (blocks.empty()) { return; }
  std::vector<core::offset_allocator::range> runs;
  try {
    runs.reserve(blocks.size());
  } catch (...) {  // no memory for the batch: one by one, as deallocate() would
    for (auto const& block : blocks) { deallocate(block); }
    return;
  }
  for (auto const& block : blocks) {
    runs.push_back({.offset = block.offset, .size = block.bytes});
  }
  std::sort(
      runs.begin(), runs.end(), [](auto const& a, auto const& b) { return a.offset < b.offset; });
  std::size_t n = 0;
  for (auto const& r : runs) {
    if (n > 0 && runs[n - 1].offset + runs[n - 1].size == r.offset) {
      runs[n - 1].size += r.size;
    } else {
      runs[n++] = r;
    }
  }
  runs.resize(n);

  std::lock_guard lock(mutex_);
  for (auto const& r : runs) { ranges_.release(r); }
  if (pinnable_ || !lending_) { return; }
  // The runs in one free range: clear from the first one's start to the last
  // one's end, once per range.
  for (std::size_t i = 0; i < runs.size();) {
    auto const free     = ranges_.free_range_at(runs[i].offset);
    auto const free_end = free.offset + free.size;
    auto end            = runs[i].offset + runs[i].size;
    std::size_t j       = i + 1;
    while (j < runs.size() && runs[j].offset < free_end) {
      end = runs[j].offset + runs[j].size;
      ++j;
    }
    clear_locked(runs[i].offset, end, free);
    i = j;
  }
}

// What a new holder reads: zeros over its whole range. The invariant behind it
// is that every free byte of the file is zero. A fresh memfd is all zeros, and
// on each release
//  - every page that the freed block touches and that is now entirely free
//    (the block merged with its free neighbours) is punched out: the kernel
//    takes the page back, so an idle pool costs no RAM, and reads of a hole
//    give zeros;
//  - the block's bytes on pages still shared with a live neighbour cannot be
//    punched (that would wipe the neighbour's data), so they are overwritten
//    with zeros: at most two partial pages per release.
// Pages wholly inside the free neighbours were zero already. This holds as long
// as a client stops writing its block before it frees it (the client resource
// frees in stream order); nothing stops a client that has mapped the pool from
// writing anywhere in it: isolation between uids comes from each uid having a
// memfd of its own (daemon/core/tenants.hpp, docs/operations.md "Tenants").
void host_backend::clear_locked(std::uint64_t block_begin,
                                std::uint64_t block_end,
                                core::offset_allocator::range now_free) noexcept
{
  auto const page       = page_size();
  auto const free_begin = now_free.offset;
  auto const free_end   = now_free.offset + now_free.size;

  // The pages the block touches, less a first or last one not entirely free.
  auto punch_begin = align_down(block_begin, page);
  if (punch_begin < free_begin) { punch_begin = align_up(block_begin, page); }
  auto punch_end = align_up(block_end, page);
  if (punch_end > free_end) { punch_end = align_down(block_end, page); }
  if (punch_end <= punch_begin) { punch_begin = punch_end = block_end; }

  if (punch_end > punch_begin && ::fallocate(fd_,
                                             FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                             static_cast<off_t>(punch_begin),
                                             static_cast<off_t>(punch_end - punch_begin)) != 0) {
    // Not expected on a memfd (shmem supports hole punching); keep the zeros
    // promise at the cost of keeping the RAM.
    // Once per free that fails: a budget, since clients decide how often.
    static log::rate_limit punch_lines{"host pool: failed hole punches", 1.0, 10};
    log::limited(punch_lines,
                 log::level::warning,
                 "host pool: cannot punch [%d, %d) out of the memfd (%s); writing zeros instead",
                 punch_begin,
                 punch_end,
                 std::strerror(errno));
    punch_begin = punch_end = block_end;
  }
  // The block's bytes outside the punched pages: before them, and after them.
  auto const ok = write_zeros(fd_, block_begin, std::min(block_end, punch_begin)) &&
                  write_zeros(fd_, std::max(block_begin, punch_end), block_end);
  if (!ok) {
    static log::rate_limit zero_lines{"host pool: failed zero writes", 1.0, 10};
    log::limited(zero_lines,
                 log::level::warning,
                 "host pool: cannot write zeros over the freed range [%d, %d) (%s); its next "
                 "holder may read the previous holder's bytes",
                 block_begin,
                 block_end,
                 std::strerror(errno));
  }
}

}  // namespace rmmd::backends::host
