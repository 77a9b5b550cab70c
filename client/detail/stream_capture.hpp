#pragma once

// Stream capture (CUDA graphs) as the client's resources meet it: whether a
// stream is capturing, the capture mode under which a capturing thread may
// make the CUDA calls an allocation needs, and frees that wait until the
// graphs that captured them are gone.
//
// Lock discipline: graph_held_frees::mutex guards its `released` list alone;
// it is taken by a user object's destructor (a CUDA thread) and by the
// resource that drains the list, never while either holds another lock.

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace rmmd::detail {

/// The graph that `stream` is capturing into; null when it is not capturing,
/// or when CUDA cannot say (a query of the legacy stream while a blocking
/// stream captures: a call on that stream would end the capture anyway).
[[nodiscard]] cudaGraph_t capturing_graph(cudaStream_t stream) noexcept;

/// Makes this thread's capture mode cudaStreamCaptureModeRelaxed while it
/// lives. Under the global mode (PyTorch's default) a thread may not make
/// "potentially unsafe" calls, cudaMemPoolImportPointer and cudaEventCreate
/// among them, while any thread captures; PyTorch's allocator relaxes the
/// mode around its own cudaMalloc the same way.
class relaxed_capture_scope {
 public:
  relaxed_capture_scope() noexcept;
  relaxed_capture_scope(relaxed_capture_scope const&)            = delete;
  relaxed_capture_scope& operator=(relaxed_capture_scope const&) = delete;
  ~relaxed_capture_scope();

 private:
  cudaStreamCaptureMode previous_{cudaStreamCaptureModeRelaxed};
  bool restore_{false};
};

/// The frees of one resource made while their stream was capturing, once
/// the graphs that hold them are gone. Shared by the resource and the CUDA
/// user objects that hold its frees (which may outlive it).
struct graph_held_frees {
  struct entry {
    void* ptr{};
    std::size_t bytes{};
    std::size_t alignment{};
    /// The daemon's allocation id (tagged as the lease table keeps it) of a
    /// lease of its own; 0 for memory carved from a slab.
    std::uint64_t lease_id{};
  };

  /// Takes what the graphs let go of (nothing, cheaply, most of the time).
  [[nodiscard]] std::vector<entry> take() noexcept;

  std::atomic<bool> any_released{false};
  std::mutex mutex;
  std::vector<entry> released;  // guarded by mutex
};

/// Gives `e` to `graph` (the graph a stream is capturing into): once that
/// graph and every executable graph instantiated from it are destroyed and
/// their launches are done, `e` joins `frees->released`. False when CUDA
/// refuses (then nothing holds it).
[[nodiscard]] bool hold_until_graph_destroyed(cudaGraph_t graph,
                                              std::shared_ptr<graph_held_frees> const& frees,
                                              graph_held_frees::entry e) noexcept;

}  // namespace rmmd::detail
