#include "client/packed_block_imports.hpp"
#include "client/detail/stderr_line.hpp"

#include "client/detail/cuda_state.hpp"
#include "client/detail/device_scope.hpp"
#include "client/detail/pool_mappings.hpp"
#include "client/detail/process_exit.hpp"
#include "client/detail/session_channel.hpp"

#include <cstdio>
#include <string>

namespace rmmd::detail {

packed_block_imports::~packed_block_imports()
{
  // At exit the daemon frees every block with the session; CUDA may be going.
  if (process_is_exiting()) { return; }
  std::lock_guard lock(imports_mutex_);
  // On the thread that ends the session: its current device is the caller's.
  for (auto const& [block, i] : imports_) {
    device_scope scope(pools_.pools()[i.pool_id].device);
    if (cudaFree(i.base) != cudaSuccess) { cudaGetLastError(); }
  }
  imports_.clear();
  for (auto const& [device, stream] : drop_streams_) {
    device_scope scope(device);
    if (cudaStreamDestroy(stream) != cudaSuccess) { cudaGetLastError(); }
  }
  drop_streams_.clear();
}

void* packed_block_imports::base(std::uint32_t pool_id,
                                 std::uint64_t block,
                                 void const* export_data)
{
  // RetireBlocks must be heard while no call reads the socket.
  channel_.start_reader();
  // One import per block: the lock is held across it (once per block), so
  // that threads whose leases lie in a block they have not seen yet do not
  // each import it. The daemon retires a block only once it holds none of
  // our leases, so no drop of it runs meanwhile.
  std::lock_guard lock(imports_mutex_);
  if (auto it = imports_.find(block); it != imports_.end()) { return it->second.base; }
  void* base = nullptr;
  auto data  = static_cast<cudaMemPoolPtrExportData const*>(export_data);
  if (auto err = cudaMemPoolImportPointer(&base,
                                          pools_.cuda_pool(pool_id, generation_of(block)),
                                          const_cast<cudaMemPoolPtrExportData*>(data));
      err != cudaSuccess) {
    cudaGetLastError();
    throw rmm::bad_alloc("rmmd: importing packed block " + std::to_string(block) + " of pool " +
                         std::to_string(pool_id) + " failed: " + cudaGetErrorName(err));
  }
  try {
    imports_.emplace(block, import{.base = base, .pool_id = pool_id});
  } catch (...) {
    // Unrecorded, the import would outlive the daemon's block (a retired
    // block never imported is dropped at once): free it, the lease with it.
    if (cudaFree(base) != cudaSuccess) { cudaGetLastError(); }
    throw;
  }
  return base;
}

void packed_block_imports::count_lease(std::uint64_t lease, std::uint64_t block) noexcept
{
  std::lock_guard live(live_mutex_);
  try {
    if (lease_block_.emplace(lease, block).second) { ++block_live_[block]; }
  } catch (std::bad_alloc const&) {
    // Uncounted (or recorded without its block's tally, which forget_lease()
    // tolerates): a RetireBlocks of its block would be obeyed.
  }
}

std::uint64_t packed_block_imports::forget_lease(std::uint64_t lease) noexcept
{
  std::lock_guard live(live_mutex_);
  auto it = lease_block_.find(lease);
  if (it == lease_block_.end()) { return 0; }
  auto const block = it->second;
  if (auto b = block_live_.find(block); b != block_live_.end()) {
    if (--b->second == 0) { block_live_.erase(b); }
  }
  lease_block_.erase(it);
  return block;
}

void packed_block_imports::say_dropped(std::uint64_t block) noexcept
{
  using call = session_channel::queued_call;
  session_channel::send_when_reached(*channel_.releases(),
                                     call{.what = call::kind::drop_block, .id = block});
}

cudaStream_t packed_block_imports::drop_stream_locked(int device) noexcept
{
  // The reader thread is ours: it keeps whichever device it made current.
  auto const then = session_channel::on_reader_thread() ? device_scope::afterwards::keep
                                                        : device_scope::afterwards::restore;
  try {
    auto& s = drop_streams_[device];
    if (s == nullptr) {
      device_scope scope(device, then);
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        s = nullptr;
      }
    }
    return s;
  } catch (std::bad_alloc const&) {
    return nullptr;  // cudaFree then waits for the device instead
  }
}

bool packed_block_imports::take_for_drop(std::uint64_t block,
                                         import& out,
                                         cudaStream_t& stream,
                                         int& device) noexcept
{
  std::lock_guard lock(imports_mutex_);
  {
    // The daemon retires only blocks whose every Free it handled, and a
    // Free is sent only after its stream passed the lease's last use. A
    // block this process still uses stays imported (and the daemon keeps
    // it) until the session ends: freeing the import under a running
    // kernel would end the process.
    std::lock_guard live(live_mutex_);
    if (auto b = block_live_.find(block); b != block_live_.end()) {
      rmmd::detail::stderr_line(
          "rmmd: the daemon asked back packed block %llu, which still holds %zu of "
          "this process's allocations; it stays until the session ends\n",
          static_cast<unsigned long long>(block),
          b->second);
      return false;
    }
  }
  auto it = imports_.find(block);
  if (it == imports_.end()) {
    // Never imported here (its one lease's import failed): nothing to free.
    say_dropped(block);
    return false;
  }
  out = it->second;
  imports_.erase(it);
  device = pools_.pools()[out.pool_id].device;
  stream = drop_stream_locked(device);
  return true;
}

void packed_block_imports::drop(std::vector<std::uint64_t> const& blocks) noexcept
{
  // At exit the daemon frees every block with the session; CUDA may be going.
  if (process_is_exiting()) { return; }
  auto const then = session_channel::on_reader_thread() ? device_scope::afterwards::keep
                                                        : device_scope::afterwards::restore;
  for (auto block : blocks) {
import taken;
    cudaStream_t stream = nullptr;
    int device          = 0;
    if (!take_for_drop(block, taken, stream, device)) { continue; }
    // Every lease of the block was freed, each after its stream passed its
    // last use: the import is idle. Free it in the order of a stream of our
    // own, wait for that, and only then may the daemon free the block.
    cudaError_t err = cudaSuccess;
    {
      device_scope scope(device, then);
      err = stream != nullptr ? cudaFreeAsync(taken.base, stream) : cudaFree(taken.base);
      if (err == cudaSuccess && stream != nullptr) { err = cudaStreamSynchronize(stream); }
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      if (cuda_is_unloading(err)) { return; }  // the process is ending after all
      rmmd::detail::stderr_line(
          "rmmd: freeing the import of packed block %llu failed (%s); the daemon keeps it "
          "until the session closes\n",
          static_cast<unsigned long long>(block),
          cudaGetErrorName(err));
      continue;
    }
    say_dropped(block);
  }
}

void packed_block_imports::forget_generation(std::uint32_t old) noexcept
{
  std::vector<std::uint64_t> idle;
  try {
    std::lock_guard lock(imports_mutex_);
    std::lock_guard live(live_mutex_);
    for (auto const& [block, i] : imports_) {
      if (generation_of(block) == old && !block_live_.contains(block)) { idle.push_back(block); }
    }
  } catch (std::bad_alloc const&) {
    return;  // they stay until the session ends
  }
  // Their BlocksDropped are about the old daemon's blocks: the channel sends none.
  drop(idle);
}

}  // namespace rmmd::detail
