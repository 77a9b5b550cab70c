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
//
//   // a process on another node of the NVLink domain, through its own daemon
//   auto r = rmmd::shared_buffer::open(session, "nodeA:team/model/w0", rmmd::open_options{});

#include <rmmd/error.hpp>
#include <rmmd/session.hpp>

#include <cuda/stream_ref>

#include <cuda/std/span>

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rmmd {

namespace detail {
struct shared_buffer_access;  // client/shared_buffer.cpp: builds one from the daemon's grant
}

/// The element type of a tensor in a manifest: the safetensors format's
/// types, named as NumPy and PyTorch name them ("float16", "bfloat16").
enum class dtype : std::uint8_t {
  bool_ = 1,
  uint8,
  int8,
  uint16,
  int16,
  float16,
  bfloat16,
  uint32,
  int32,
  float32,
  uint64,
  int64,
  float64,
  float8_e4m3fn,
  float8_e5m2,
  complex64,
  complex128,
};

/// Bytes per element.
[[nodiscard]] std::size_t itemsize(dtype t) noexcept;
/// "float16", "bool", "float8_e4m3fn", ... ("unknown" for a number that is
/// none of them: a newer daemon's type; its itemsize() is 0).
[[nodiscard]] std::string_view to_string(dtype t) noexcept;
/// The inverse of to_string(); nullopt for a name that is none of them.
[[nodiscard]] std::optional<dtype> dtype_from_string(std::string_view name) noexcept;

/// One named tensor inside a buffer: elements of `type` at `byte_offset`,
/// laid out by `shape` and `strides` (in elements, as PyTorch counts them;
/// empty: contiguous, row-major).
struct tensor_entry {
  std::string name{};
  rmmd::dtype type{dtype::uint8};
  std::vector<std::uint64_t> shape{};
  std::uint64_t byte_offset{};
  std::vector<std::uint64_t> strides{};
  /// Other names of the same tensor (tied weights).
  std::vector<std::string> aliases{};

  /// The product of shape (1 for a scalar; saturates at 2^64 - 1).
  [[nodiscard]] std::uint64_t element_count() const noexcept;
  /// The bytes from byte_offset that its elements span (0 when empty):
  /// itemsize * (1 + sum((shape[i] - 1) * strides[i])); saturates.
  [[nodiscard]] std::uint64_t byte_extent() const noexcept;
  /// Row-major: no strides, or the row-major ones (a dimension of one
  /// element may have any stride, as PyTorch judges it).
  [[nodiscard]] bool contiguous() const noexcept;
};

/// What a buffer holds: set by its creator before publish(), returned with
/// every open. The daemon checks it (names unique, tensors inside the
/// buffer and not overlapping, bounds in docs/sharing.md) and adds the
/// label "rmmd.gpu_uuid" on CUDA pools.
struct buffer_manifest {
  std::vector<tensor_entry> tensors{};
  /// model, revision, quantisation, parallel rank, framework version, ...
  std::map<std::string, std::string, std::less<>> labels{};

  /// The tensor named `name` (or with `name` among its aliases); null if none.
  [[nodiscard]] tensor_entry const* find(std::string_view name) const noexcept;
  [[nodiscard]] bool empty() const noexcept
  {
    return tensors.empty() && labels.empty();
  }
};

/// How a process holds a buffer. The creator holds it read-write.
enum class buffer_access : std::uint8_t {
  /// The default: CUDA buffers of their own allocation are mapped with read
  /// access only (a write is a CUDA error in the writing process, and in no
  /// other), host buffers with PROT_READ.
  read,
  /// Only where the creator allowed writers (shared_buffer_options).
  read_write,
};

/// Whether a host buffer of a pinnable pool is page-locked in this process
/// (cudaHostRegister), so that kernels use its address and copies run at
/// full speed (docs/sharing.md, "Host buffers and CUDA contexts").
/// Page-locking needs a CUDA context, and a context costs about 500 MiB
/// of its GPU's memory. Device buffers ignore it.
enum class pinning : std::uint8_t {
  /// Page-locked where this process has a CUDA context already (the calling
  /// thread's current one, or a primary context active on any device: what
  /// the CUDA runtime, PyTorch and CuPy make at their first GPU call), a
  /// plain mapping otherwise: an open makes no context.
  automatic,
  /// Page-locked, making the calling thread's current device's primary
  /// context where the process has none. Where it cannot be, the open (or
  /// create) throws and nothing stays open: rmmd::logic_error for a pool
  /// that is not pinnable (rmmd --host-pool-pinned=off), rmm::bad_alloc
  /// naming the CUDA error (no GPU, RLIMIT_MEMLOCK).
  required,
  /// A plain mapping (unless this session has the buffer mapped with the
  /// same access and page-locked already, for an earlier open): host code
  /// reads and writes it; CUDA copies treat it as any pageable memory.
  off,
};

/// How to open a buffer.
struct open_options {
  /// Waits up to this long for the buffer to be created and published (the
  /// daemon wakes the call at the publication); zero: refuses at once.
  std::chrono::milliseconds wait{};
  buffer_access access{buffer_access::read};
  /// The fingerprint guard: labels the buffer must carry with exactly these
  /// values; otherwise rmmd::precondition_error naming the first key that
  /// differs, and nothing is opened.
  std::map<std::string, std::string, std::less<>> expect_labels{};
  /// A buffer of another node of the NVLink domain: that node's name as
  /// this node's rmmd.conf names it (peering.peers), which this node's
  /// daemon asks for the buffer (docs/operations.md, "Across nodes"). The
  /// name may say it instead: "NODE:NAME". Empty: as the name says.
  std::string peer{};
  /// A buffer of another node: this process's CUDA device that maps it (the
  /// memory is imported by its fabric handle, through the IMEX channel);
  /// -1: the calling thread's current device. A process that sees no GPU,
  /// or fewer than device + 1, gets rmmd::logic_error before any request.
  /// This node's buffers are mapped on their pool's device: there, a device
  /// other than -1 is a check, and one that is not the pool's (or a host
  /// pool's buffer) is rmmd::logic_error, with nothing left open.
  int device{-1};
  /// Take the buffer's write lease (docs/failover.md): at most one session
  /// holds it. Needs access read_write and a buffer of this node
  /// (rmmd::logic_error otherwise, before any request). While another
  /// session holds it, or has the buffer open read-write without it, the
  /// open waits up to `wait` in line, first come first served, and is
  /// granted when the holder closes its exclusive open or its session ends
  /// (exit, crash, SIGKILL); lease_generation() says which grant this is.
  /// A wait that ends first throws rmmd::deadline_error naming the holder,
  /// and nothing changed. rmmd::precondition_error: this session holds the
  /// lease already.
  bool exclusive{false};
  /// With exclusive (rmmd::logic_error otherwise, before any request): a
  /// standby (docs/failover.md, "A standby that is ready"). open() does not
  /// wait for the lease (`wait` still applies to the buffer's publication):
  /// it returns at once with the buffer mapped, holding the lease where it
  /// is free and standing in the line for it otherwise, so that the process
  /// captures its CUDA graphs against data() before it may write. Until the
  /// grant the mapping is read-only where the memory allows (a buffer's own
  /// VMM allocation: cuMemSetAccess with read access; a host buffer:
  /// PROT_READ); a pool pointer (--cuda-shared-buffer-memory=pool) is mapped
  /// read-write from the start. wait_lease() waits for the grant and makes
  /// the same mapping read-write in place: data() does not change.
  bool standby{false};
  /// A host buffer: page-locked here or not (pinning says when).
  pinning pin{pinning::automatic};
};

/// A buffer as the daemon lists it.
struct buffer_info {
  std::uint64_t id{};
  std::string name{};
  std::string pool{};  ///< the pool's name
  std::size_t size{};
  uid_t creator_uid{};
  std::optional<gid_t> gid{};
  std::uint32_t holders{};  ///< sessions that hold it now
  bool published{false};
  bool persistent{false};
  bool allow_writers{false};
  std::map<std::string, std::string, std::less<>> labels{};  ///< the manifest's
  std::size_t tensor_count{};                                ///< the manifest's
  /// The node whose buffer it is (buffer_filter::peer); empty: this node.
  /// Such an entry has no id, pool or creator (that node's business): open
  /// it as NODE:NAME.
  std::string peer{};
};

/// Which buffers list() returns: both filters at once; empty: all the caller
/// may see (its own uid's, its groups' and, for root, every buffer).
struct buffer_filter {
  std::string name_prefix{};
  /// Buffers carrying each of these labels with this value.
  std::map<std::string, std::string, std::less<>> labels{};
  /// Another node's buffers (its name as peering.peers names it): those
  /// this node's grant there lets it open, published and in a fabric pool
  /// (at most 4096, by name). Empty: this node's.
  std::string peer{};
};

/// What a creator chooses beyond name and size.
struct shared_buffer_options {
  /// The pool by name (`rmmctl pools`). Empty: the CUDA pool of `device`.
  std::string pool{};
  /// This process's CUDA device whose pool to use when `pool` is empty; -1:
  /// the calling thread's current device.
  int device{-1};
  /// Keep the buffer after its last holder is gone, until it is deleted
  /// (`rmmctl buffers delete NAME`); a restart keeps it where a service
  /// manager keeps rmmd's fd store, elsewhere it goes when the daemon stops.
  bool persistent{false};
  /// Members of this group may open it too; unset: the creator's uid only
  /// (and root).
  std::optional<gid_t> gid{};
  /// A power of two up to the pool's max_alignment.
  std::size_t alignment{256};
  /// Others may open it with buffer_access::read_write. Unset, every other
  /// holder reads only (in hardware on CUDA buffers of their own allocation).
  bool allow_writers{false};
  /// A buffer of a host pool: the creator's mapping page-locked or not
  /// (pinning says when).
  pinning pin{pinning::automatic};
};

/// One hold of a named shared buffer by this process: the creator's, from
/// create(), or a consumer's, from open(). Move-only; the destructor closes
/// it (close() says how).
///
/// The memory is the pool's: device memory of a CUDA pool (imported once per
/// session however often it is opened), or a host pool's shared memory
/// (page-locked for the GPU where the pool is pinnable and this process has
/// a CUDA context already, or the open asked for it: pinning). Consumers
/// open it read-only unless the creator allowed writers; on a buffer of its
/// own allocation (CUDA's default) and on host buffers the mapping itself is
/// read-only (a write is a CUDA error in the writing process, or SIGSEGV on
/// a host buffer), on a pool pointer (--cuda-shared-buffer-memory=pool) it
/// is the API's contract only (docs/sharing.md). A process that opens the
/// same buffer for reading and read-write has two mappings of it, one of
/// each access, at two addresses (data() of each open), each released with
/// its last open.
///
/// Throws (create, open): rmmd::logic_error for a bad name, size, alignment
/// or pool, rmmd::not_found_error (no such name, or none this uid or gid may
/// open: the same answer), rmmd::already_exists_error (name taken),
/// rmmd::logic_error (not published yet), rmmd::permission_error (for writing
/// where the creator allowed no writers), rmm::out_of_memory (quota, pool), rmmd::session_error
/// (daemon gone), rmm::bad_alloc (a CUDA error, named); an exclusive open
/// also rmmd::deadline_error (the write lease stayed with another session
/// to the end of the wait; never a standby's open, which does not wait for
/// it) and rmmd::precondition_error (a plain read-write
/// open while another session holds or waits for the lease).
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
  /// Opens `name` as `options` say (access, the fingerprint guard, wait,
  /// peer). `name` is NAME, or NODE:NAME for a buffer of another node of the
  /// NVLink domain (or options.peer names the node): this node's daemon asks
  /// NODE's, which checks this node's certificate against its grants, and
  /// the memory is imported by its fabric handle (read-only unless
  /// read_write was granted). A malformed address (':' twice, an empty or
  /// invalid node, a node that differs from options.peer) is
  /// rmmd::logic_error before any request. Throws also
  /// rmmd::permission_error (read_write where the creator did not allow
  /// writers; a peer whose grants do not name the buffer),
  /// rmmd::precondition_error (a label differs; a remote buffer outside a
  /// fabric pool), rmmd::not_found_error (no such peer in peering.peers).
  [[nodiscard]] static shared_buffer open(session const& s,
                                          std::string_view name,
                                          open_options const& options);

  /// Opens the one published buffer that carries every label of `labels`
  /// with its value, on options.peer's node (empty: this node): list()s
  /// them, then open()s that name with `labels` added to
  /// options.expect_labels, so that what is opened carries them even if the
  /// name changed hands in between. Throws rmmd::logic_error for no labels,
  /// or a label that options.expect_labels gives another value;
  /// rmmd::not_found_error when no buffer carries them (naming them);
  /// rmmd::precondition_error when several do (naming them: add a label
  /// that tells them apart); and what list() and open() throw.
  /// options.wait is the open's: the search does not wait for a buffer to
  /// appear.
  [[nodiscard]] static shared_buffer open_by_labels(
      session const& s,
      std::map<std::string, std::string, std::less<>> const& labels,
      open_options const& options = {});

  /// The buffers the caller may see that `filter` selects, by name.
  /// rmmd::not_found_error for a filter.peer that peering.peers does not
  /// name; rmmd::session_error while that node cannot be reached.
  [[nodiscard]] static std::vector<buffer_info> list(session const& s,
                                                     buffer_filter const& filter = {});
  /// One buffer by name, with its manifest, without opening it.
  /// rmmd::not_found_error for a name the caller may not see.
  [[nodiscard]] static std::pair<buffer_info, buffer_manifest> describe(session const& s,
                                                                        std::string_view name);

  /// Deletes the buffer named `name`: the name is free at once, the memory
  /// goes back after the last holder. Returns how many sessions hold it
  /// still. Only the creator's uid and root may (rmmd::permission_error for
  /// a uid that may open it); rmmd::not_found_error when no buffer has the
  /// name or this uid may not open it.
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

  /// Sets what the buffer holds (replacing an earlier manifest). Creator
  /// only, before publish() (rmmd::precondition_error otherwise);
  /// rmmd::logic_error (INVALID_ARGUMENT) names what is wrong with a table
  /// that overlaps, runs past the buffer or is malformed. manifest() is then
  /// what the daemon holds, read back (its "rmmd.gpu_uuid" label included).
  void set_manifest(buffer_manifest const& manifest);
  /// The manifest as the daemon holds it (its own labels included); empty
  /// when the buffer has none.
  [[nodiscard]] buffer_manifest const& manifest() const noexcept
  {
    return manifest_;
  }
  [[nodiscard]] buffer_access access() const noexcept
  {
    return access_;
  }
  /// An exclusive open (open_options::exclusive): this process holds the
  /// buffer's write lease until it closes this open or its session ends, or
  /// (a standby) stands in line for it.
  [[nodiscard]] bool exclusive() const noexcept
  {
    return lease_generation_ != 0 || standby_;
  }
  /// Whether this open holds the write lease (an exclusive open; a standby
  /// once wait_lease() returned, or when the lease was free at its open).
  [[nodiscard]] bool holds_lease() const noexcept
  {
    return lease_generation_ != 0;
  }
  /// The write lease's generation this open holds (0: it holds none yet, or
  /// is not an exclusive open). Each grant of a buffer's lease has a larger
  /// one than the grants before it (one more, while the daemon runs), so a
  /// write stamped with it tells this holder's writes from an earlier
  /// holder's late ones.
  [[nodiscard]] std::uint64_t lease_generation() const noexcept
  {
    return lease_generation_;
  }
  /// A standby open (open_options::standby): waits up to `wait` for the
  /// write lease and returns its generation (at once where this open holds
  /// it already). At the grant the mapping becomes read-write in place:
  /// data() is the same before and after, and every CUDA graph captured
  /// against it stays valid. The daemon holds each call at most 10 minutes
  /// and the client asks again with what is left; the place in line stays.
  /// Throws rmmd::deadline_error when the wait ends first (naming the
  /// holder; nothing changed: the standby stays in line),
  /// rmmd::precondition_error (not a standby open),
  /// rmmd::not_found_error (the buffer was deleted while it stood in line),
  /// rmmd::session_error (the session ended or the daemon is gone),
  /// rmm::bad_alloc (the mapping could not be made read-write: a CUDA or
  /// mprotect error, named; the lease is held all the same).
  std::uint64_t wait_lease(std::chrono::milliseconds wait);

  /// Lets go of the buffer after the work queued on `stream`: the stream is
  /// synchronised, this process's mapping of the buffer undone (the last open
  /// here), and the daemon told. (A CUDA buffer is an allocation of its own,
  /// whose unmapping is a CUDA call that a stream's host function may not
  /// make; so close() waits for the stream, where a free does not.) A pool
  /// pointer (--cuda-shared-buffer-memory=pool) is freed in the stream's
  /// order instead: close() returns at once and the daemon is told when the
  /// stream gets there, so another process's exclusive open made just
  /// after may find this open still counted (give that open a `wait`). The
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
  /// rmmd::logic_error for a buffer of another node (peer()), whose pool is
  /// that node's.
  [[nodiscard]] pool_info const& pool() const;
  [[nodiscard]] bool is_host() const;
  /// The node whose daemon holds the memory, for a buffer opened as
  /// NODE:NAME; empty for this node's buffers.
  [[nodiscard]] std::string const& peer() const noexcept
  {
    return peer_;
  }
  /// This process's CUDA device the memory is mapped for; -1 for a host
  /// buffer.
  [[nodiscard]] int device() const;
  /// A host buffer page-locked in this process (pinning), by this open or
  /// an earlier one of the same mapping; false for device memory and for
  /// an empty buffer.
  [[nodiscard]] bool pinned() const;
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
  friend struct detail::shared_buffer_access;

  void reset() noexcept;
  /// Tells the daemon this open is closed (printing, not throwing, a refusal).
  void send_close() const noexcept;
  /// Which of the session's opens this one is, as a close names it
  /// (rmmd.v1.BufferHold's number).
  [[nodiscard]] std::uint8_t hold_kind() const noexcept;
  /// Which of this process's views of the buffer this open has
  /// (detail::view_mode's number).
  [[nodiscard]] std::uint8_t view_mode() const noexcept;
  void synchronize(cuda::stream_ref stream) const noexcept;

  std::optional<session> session_;
  void* data_{};
  std::size_t size_{};
  std::uint64_t id_{};
  std::uint32_t pool_id_{};
  std::string name_;
  std::string peer_;
  int peer_device_{-1};  ///< where a buffer of another node is mapped
  buffer_manifest manifest_;
  buffer_access access_{buffer_access::read_write};
  bool creator_{false};
  bool persistent_{false};
  std::uint64_t lease_generation_{};
  bool standby_{false};  ///< a standby open: its view is upgraded in place at the grant
  std::optional<cuda::stream_ref> stream_;
};

}  // namespace rmmd
