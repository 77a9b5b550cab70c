#pragma once

// Named shared buffers: memory one process creates, writes and publishes,
// and any allowed process opens by name and uses without a copy, with the
// daemon keeping the lifetime straight (docs/sharing.md).
//
//   // producer
//   auto buf = rmmd::shared_buffer::create(session, "team/model/w0", bytes);
//   fill<<<grid, block, 0, stream>>>(static_cast<float*>(buf.data()), n);
//   buf.publish(stream);  // consumers see it once the stream has written it
//
//   // consumer (another process)
//   auto w = rmmd::shared_buffer::open(session, "team/model/w0", std::chrono::seconds(30));
//   use<<<grid, block, 0, stream>>>(w.span<float const>().data(), n);

#include <rmmd/error.hpp>
#include <rmmd/session.hpp>

#include <cuda/stream_ref>

#include <cuda/std/span>

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rmmd {

namespace v1 {
class BufferGrant;  // the wire message (rmmd/v1/rmmd.pb.h); only declared here
}

/// What a creator chooses beyond name and size.
struct shared_buffer_options {
  /// The pool by name (`rmmctl pools`). Empty: the CUDA pool of `device`.
  std::string pool{};
  /// This process's CUDA device whose pool to use when `pool` is empty; -1:
  /// the calling thread's current device.
  int device{-1};
  /// Keep the buffer after its last holder is gone, until it is deleted
  /// (`rmmctl buffers delete NAME`) or the daemon stops.
  bool persistent{false};
  /// Members of this group may open it too; unset: the creator's uid only
  /// (and root).
  std::optional<gid_t> gid{};
  /// A power of two up to the pool's max_alignment.
  std::size_t alignment{256};
};

/// One hold of a named shared buffer by this process: the creator's, from
/// create(), or a consumer's, from open(). Move-only; the destructor closes
/// it (close() says how).
///
/// The memory is the pool's: device memory of a CUDA pool (imported once per
/// session however often it is opened), or a host pool's shared memory
/// (page-locked for the GPU where the pool is pinnable and this process has
/// a GPU). "Read-only" for consumers is a contract: CUDA cannot map an
/// imported range read-only, so every holder can write (docs/sharing.md).
///
/// Throws (create, open): rmmd::logic_error for a bad name, size, alignment
/// or pool, rmmd::not_found_error (no such name), rmmd::already_exists_error
/// (name taken), rmmd::logic_error (not published yet), rmmd::permission_error
/// (uid or gid), rmm::out_of_memory (quota, pool), rmmd::session_error
/// (daemon gone), rmm::bad_alloc (a CUDA error, named).
///
/// Thread safety: distinct objects may be used from any thread; one object
/// is not to be used from two threads at once.
class shared_buffer {
 public:
  /// Creates `bytes` bytes named `name`, held by this process and seen by no
  /// other until publish(). The memory is ready on every stream.
  [[nodiscard]] static shared_buffer create(session const& s,
                                            std::string_view name,
                                            std::size_t bytes,
                                            shared_buffer_options const& options = {});

  /// Opens the published buffer `name`. With a `wait`, waits up to that long
  /// for it to be created and published (the daemon wakes the call at the
  /// publication); without, throws at once when it is missing or unpublished.
  [[nodiscard]] static shared_buffer open(session const& s,
                                          std::string_view name,
                                          std::chrono::milliseconds wait = {});

  /// Deletes the buffer named `name`: the name is free at once, the memory
  /// goes back after the last holder. Returns how many sessions hold it
  /// still. Only the creator's uid and root may (rmmd::permission_error);
  /// rmmd::not_found_error when no buffer has the name.
  static std::size_t remove(session const& s, std::string_view name);

  /// An empty buffer (what a moved-from one is): data() is null.
  shared_buffer() noexcept = default;
  shared_buffer(shared_buffer&& other) noexcept;
  shared_buffer& operator=(shared_buffer&& other) noexcept;
  shared_buffer(shared_buffer const&)            = delete;
  shared_buffer& operator=(shared_buffer const&) = delete;
  /// close() on stream() (CUDA pools) or at once (host pools without one).
  ~shared_buffer();

  /// Publishes once `stream` has done the work queued on it so far (the
  /// creator's writes): a CUDA host function sends the publication when the
  /// stream reaches it, so this returns without waiting for the GPU, and
  /// consumers that open the buffer see every byte written before. Creator
  /// only; a refusal the daemon sends later (FAILED_PRECONDITION: published
  /// twice) is printed on stderr. Also makes `stream` this buffer's stream.
  void publish(cuda::stream_ref stream);
  /// Publishes now: the caller's writes are complete (host writes, or a
  /// synchronised stream). Throws rmmd::logic_error when not the creator or
  /// published already.
  void publish();

  /// Lets go of the buffer after the work queued on `stream`: the stream is
  /// synchronised, this process's mapping of the buffer undone (the last open
  /// here), and the daemon told. (A CUDA buffer is an allocation of its own,
  /// whose unmapping is a CUDA call that a stream's host function may not
  /// make; so close() waits for the stream, where a free does not.) The
  /// memory goes back when the last holder is gone (unless persistent).
  /// Never throws; the buffer is empty afterwards.
  void close(cuda::stream_ref stream) noexcept;
  /// close() on stream() (or at once, for a host buffer without one).
  void close() noexcept;

  /// The stream close() and the destructor use: publish()'s, or set here.
  /// CUDA buffers default to the legacy default stream.
  void set_stream(cuda::stream_ref stream) noexcept
  {
    stream_ = stream;
  }
  [[nodiscard]] std::optional<cuda::stream_ref> stream() const noexcept
  {
    return stream_;
  }

  [[nodiscard]] void* data() const noexcept
  {
    return data_;
  }
  [[nodiscard]] std::size_t size() const noexcept
  {
    return size_;
  }
  [[nodiscard]] std::string const& name() const noexcept
  {
    return name_;
  }
  /// The daemon's id for it (rmmctl buffers shows it).
  [[nodiscard]] std::uint64_t id() const noexcept
  {
    return id_;
  }
  /// The pool it lives in (its `device` is this process's ordinal).
  [[nodiscard]] pool_info const& pool() const;
  [[nodiscard]] bool is_host() const;
  /// Made by create() in this process (then publish() is allowed).
  [[nodiscard]] bool is_creator() const noexcept
  {
    return creator_;
  }
  [[nodiscard]] bool persistent() const noexcept
  {
    return persistent_;
  }
  explicit operator bool() const noexcept
  {
    return data_ != nullptr;
  }

  /// The memory as `size() / sizeof(T)` elements of T (cuda::std::span works
  /// in host and device code alike).
  template <typename T = std::byte>
  [[nodiscard]] cuda::std::span<T> span() const noexcept
  {
    return {static_cast<T*>(data_), size_ / sizeof(T)};
  }

 private:
  /// This process's view of a buffer the daemon granted (by create or open).
  static shared_buffer attached(session const& s, v1::BufferGrant const& grant, bool creator);
  void reset() noexcept;
  void send_close(detail::session_impl& impl) const noexcept;
  void synchronize(cuda::stream_ref stream) const noexcept;

  std::optional<session> session_;
  void* data_{};
  std::size_t size_{};
  std::uint64_t id_{};
  std::uint32_t pool_id_{};
  std::string name_;
  bool creator_{false};
  bool persistent_{false};
  std::optional<cuda::stream_ref> stream_;
};

}  // namespace rmmd
