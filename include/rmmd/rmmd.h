/*
 * rmmd's C ABI (librmmd_c.so, CMake target rmmd::c, pkg-config rmmd): what
 * other languages reach rmmd through (the Python package `rmmd` loads it with
 * ctypes), and what PyTorch's CUDAPluggableAllocator loads.
 *
 * Conventions (STYLE.md, "From C APIs that last"):
 *  - Opaque handles with _create / _destroy pairs.
 *  - Every function but the PyTorch entry points returns an rmmd_status and
 *    writes its results through out-parameters, last. On failure nothing is
 *    written and rmmd_last_error_message() says what went wrong, in words,
 *    for the calling thread.
 *  - Only C types cross: no exceptions, no C++ types. Structs passed in begin
 *    with their `size` (set it to sizeof the struct you compiled against), so
 *    that they can grow.
 *  - Streams are cudaStream_t passed as void* (NULL: the legacy default
 *    stream), so that this header needs no CUDA header.
 *  - Every function may be called from any thread. A handle must not be
 *    destroyed while another thread uses it.
 */
#ifndef RMMD_RMMD_H
#define RMMD_RMMD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define RMMD_API __attribute__((visibility("default")))
#else
#define RMMD_API
#endif

#define RMMD_VERSION_MAJOR 0
#define RMMD_VERSION_MINOR 1
#define RMMD_VERSION_PATCH 0
/* major * 10000 + minor * 100 + patch */
#define RMMD_VERSION (RMMD_VERSION_MAJOR * 10000 + RMMD_VERSION_MINOR * 100 + RMMD_VERSION_PATCH)

/* DESIGN.md's error table; the values are gRPC's status codes. */
typedef enum rmmd_status {
  RMMD_SUCCESS                   = 0,
  RMMD_ERROR_INVALID_ARGUMENT    = 3, /* bad size, alignment, name, pool, handle */
  RMMD_ERROR_DEADLINE_EXCEEDED   = 4, /* a wait ended first (a write lease held): nothing changed */
  RMMD_ERROR_NOT_FOUND           = 5, /* no such allocation or shared buffer */
  RMMD_ERROR_ALREADY_EXISTS      = 6, /* a shared buffer of that name exists */
  RMMD_ERROR_PERMISSION_DENIED   = 7, /* uid or gid not allowed */
  RMMD_ERROR_OUT_OF_MEMORY       = 8, /* quota, pool limit, device memory */
  RMMD_ERROR_FAILED_PRECONDITION = 9, /* not published yet, not the creator, ... */
  RMMD_ERROR_INTERNAL            = 13, /* a CUDA or system error, named in the message */
  RMMD_ERROR_SESSION             = 14  /* no daemon, daemon gone or draining, session lost */
} rmmd_status;

/* "0.1.0": the library's version (compare with RMMD_VERSION at build time). */
RMMD_API char const* rmmd_version(void);
/* RMMD_VERSION of the library. */
RMMD_API int rmmd_version_number(void);
/* What the calling thread's last failed call said; "" if none failed yet.
 * Valid until the thread's next rmmd call. */
RMMD_API char const* rmmd_last_error_message(void);
/* "RMMD_ERROR_NOT_FOUND", ... */
RMMD_API char const* rmmd_status_name(rmmd_status status);
/* Frees a string an rmmd function returned (JSON). NULL is fine. */
RMMD_API void rmmd_string_free(char* s);

/* ---- sessions ---------------------------------------------------------- */

typedef struct rmmd_session_s* rmmd_session_t;

/* What a session that reconnected to a restarted daemon tells its
 * on_reconnect callback (rmmd::reconnect_info). */
typedef struct rmmd_reconnect_info {
  size_t size;                  /* sizeof(rmmd_reconnect_info) */
  uint64_t previous_session_id; /* the id the daemon that went away gave */
  uint64_t session_id;          /* the new daemon's id for the session */
  uint32_t reconnects;          /* this session's reconnects, this one included */
  uint32_t buffers_held_again;  /* open shared buffers the new daemon holds again */
  uint32_t buffers_unknown;     /* open shared buffers it does not know (kept mapped) */
} rmmd_reconnect_info;

/* Runs after each reconnect, on the thread that reconnected, with no lock of
 * the session held (it may call the session). `info` is valid during the call. */
typedef void (*rmmd_reconnect_fn)(void* user_data, rmmd_reconnect_info const* info);

typedef struct rmmd_session_options {
  size_t size;              /* sizeof(rmmd_session_options) */
  char const* runtime_dir;  /* NULL: $RMMD_RUNTIME_DIR, else /run/rmmd */
  char const* client_name;  /* shown in rmmctl stats; NULL: none */
  int use_grpc;             /* nonzero: calls over gRPC, not the session socket */
  int import_by_fabric;     /* nonzero: import CUDA pools by fabric handle */
  uint32_t call_timeout_ms; /* 0: 30000 */
  /* Added after the fields above (a caller built with the older layout
   * passes its size, 40 on 64-bit, and gets the defaults). When the daemon goes away (restart,
   * crash), the session waits up to reconnect_ms for one to serve the runtime directory again and
   * reconnects to it: memory held from before stays valid and is freed locally, new allocations
   * come from the new daemon, open shared buffers stay mapped and are held again where the new
   * daemon has them (rmmd::session::options::reconnect says it all). One line on stderr and one
   * on_reconnect call per reconnect. A daemon that does not come back in time: calls fail with
   * RMMD_ERROR_SESSION, as with no reconnect. */
  rmmd_reconnect_fn on_reconnect; /* NULL: none */
  void* on_reconnect_user_data;   /* passed to on_reconnect */
  int64_t reconnect_ms;           /* 0: 60000; negative: no reconnect */
} rmmd_session_options;

/* options may be NULL (all defaults). */
RMMD_API rmmd_status rmmd_session_create(rmmd_session_options const* options,
                                         rmmd_session_t* session);
/* Ends this handle's share: the session closes once every resource and
 * buffer made from it is gone too. NULL is fine. */
RMMD_API rmmd_status rmmd_session_destroy(rmmd_session_t session);
/* The daemon's id for the session (a new one after each reconnect). */
RMMD_API rmmd_status rmmd_session_id(rmmd_session_t session, uint64_t* id);
/* How many times the session has reconnected to a restarted daemon. */
RMMD_API rmmd_status rmmd_session_reconnects(rmmd_session_t session, uint32_t* reconnects);
/* The pools, as JSON: [{"id":0,"name":"host","backend":"host","device":-1,
 * "capacity_bytes":...,"pinnable":false,"gpu_uuid":"","max_alignment":...},...].
 * Free with rmmd_string_free. */
RMMD_API rmmd_status rmmd_session_pools_json(rmmd_session_t session, char** json);
/* The daemon's stats (rmmd.v1.Stats in protobuf's JSON mapping, as rmmctl
 * stats --json prints it). Free with rmmd_string_free. */
RMMD_API rmmd_status rmmd_session_stats_json(rmmd_session_t session, char** json);

/* ---- memory resources -------------------------------------------------- */

typedef struct rmmd_resource_s* rmmd_resource_t;

typedef enum rmmd_resource_kind {
  RMMD_RESOURCE_DEVICE      = 0, /* a CUDA pool (rmmd::ipc_memory_resource) */
  RMMD_RESOURCE_HOST        = 1, /* a host pool (rmmd::host_memory_resource) */
  RMMD_RESOURCE_PINNED_HOST = 2  /* a pinnable host pool, page-locked */
} rmmd_resource_kind;

typedef enum rmmd_allocation_mode {
  RMMD_MODE_SLAB   = 0, /* carve from leased slabs in-process (fast path) */
  RMMD_MODE_DIRECT = 1  /* one daemon allocation per allocate */
} rmmd_allocation_mode;

#define RMMD_CARVING_LANES_AUTO 0u

/* rmmd_resource_options.capture_checks (rmmd::capture_checks): whether a
 * device resource asks CUDA, on each allocate and deallocate, if the stream
 * is capturing a graph. */
typedef enum rmmd_capture_checks {
  /* 0, and for callers built before this field (a smaller size): direct mode
   * checks every call, slab mode only where it would lease a slab. */
  RMMD_CAPTURE_CHECKS_AUTOMATIC = 0,
  /* graph-safe: memory freed during a capture stays the graph's until the
   * graph is destroyed; an allocation during capture is a lease of its own. */
  RMMD_CAPTURE_CHECKS_EVERY_CALL = 1,
  /* slab mode: as RMM's pool under capture (a free during capture goes back
   * to the slab at once); direct mode checks every call anyway. */
  RMMD_CAPTURE_CHECKS_SLOW_PATH_ONLY = 2
} rmmd_capture_checks;

typedef struct rmmd_resource_options {
  size_t size; /* sizeof(rmmd_resource_options) */
  rmmd_resource_kind kind;
  int device;                /* device resources: this process's ordinal; -1: current */
  char const* pool;          /* a pool by name; NULL: by device (or the first host pool) */
  rmmd_allocation_mode mode; /* device resources */
  /* Slab mode: carving lanes (one RMM pool per lane, a thread's allocations
   * carved by one, so that threads allocating at once do not queue on one
   * lock). 0 (RMMD_CARVING_LANES_AUTO, and for callers built before 0.3,
   * whose size is smaller): one lane while one thread allocates, a lane per
   * allocating thread once a second one does, up to the process's CPUs (at
   * most 16). 1 to 16: that many lanes. */
  unsigned carving_lanes;
  rmmd_capture_checks capture_checks; /* device resources */
} rmmd_resource_options;

RMMD_API rmmd_status rmmd_resource_create(rmmd_session_t session,
                                          rmmd_resource_options const* options,
                                          rmmd_resource_t* resource);
/* Gives back what is still allocated from it. NULL is fine. */
RMMD_API rmmd_status rmmd_resource_destroy(rmmd_resource_t resource);
/* Stream-ordered, as RMM's resources are; bytes 0 gives NULL. */
RMMD_API rmmd_status
rmmd_allocate(rmmd_resource_t resource, size_t bytes, size_t alignment, void* stream, void** ptr);
RMMD_API rmmd_status
rmmd_deallocate(rmmd_resource_t resource, void* ptr, size_t bytes, size_t alignment, void* stream);

/* What this process allocated through one resource (what a framework's own
 * memory statistics cannot see under an external allocator). */
typedef struct rmmd_resource_stats {
  size_t size;                /* sizeof(rmmd_resource_stats), set by the caller */
  uint64_t allocated_bytes;   /* live allocations' bytes */
  uint64_t allocation_count;  /* live allocations */
  uint64_t high_water_bytes;  /* most allocated_bytes at once */
  uint64_t total_allocations; /* since the resource was made */
  int device;                 /* -1 for host resources */
} rmmd_resource_stats;

RMMD_API rmmd_status rmmd_resource_get_stats(rmmd_resource_t resource, rmmd_resource_stats* stats);

/* ---- named shared buffers (docs/sharing.md) ----------------------------- */

typedef struct rmmd_buffer_s* rmmd_buffer_t;

/* Whether a host buffer of a pinnable pool is page-locked in this process
 * (cudaHostRegister: kernels use its address, copies run at full speed).
 * Page-locking needs a CUDA context, which costs about 500 MiB of its
 * GPU's memory (docs/sharing.md, "Host buffers and CUDA contexts"). Device
 * buffers ignore it. */
typedef enum rmmd_pinning {
  /* page-locked where the process has a CUDA context already (the calling
   * thread's, or a primary context active on any device: what the runtime,
   * PyTorch and CuPy make); plain otherwise, making none */
  RMMD_PINNING_AUTOMATIC = 0,
  /* page-locked, making the current device's primary context where the
   * process has none; where it cannot be, the call fails and nothing stays
   * open: RMMD_ERROR_INVALID_ARGUMENT for a pool that is not pinnable,
   * RMMD_ERROR_INTERNAL naming the CUDA error (no GPU, RLIMIT_MEMLOCK) */
  RMMD_PINNING_REQUIRED = 1,
  RMMD_PINNING_OFF      = 2 /* plain shared memory */
} rmmd_pinning;

typedef struct rmmd_buffer_options {
  size_t size;      /* sizeof(rmmd_buffer_options) */
  char const* pool; /* by name; NULL: the CUDA pool of `device` */
  int device;       /* -1: the current device */
  int persistent;   /* nonzero: stays until deleted (across restarts where a service manager
                     * keeps rmmd's fd store; elsewhere until the daemon stops) */
  int has_gid;      /* nonzero: members of `gid` may open it too */
  uint32_t gid;
  size_t alignment; /* 0: 256 */
  /* nonzero: others may open it with RMMD_BUFFER_READ_WRITE (0.4; callers
   * built before, whose size is smaller: 0) */
  int allow_writers;
  /* The padding that ended 0.8's struct, named so that `pin` lies past the
   * size of 0.8's struct: ignored. */
  int reserved_0;
  /* A host pool's buffer: the creator's mapping page-locked as rmmd_pinning
   * says (0.9; callers built before, whose size is smaller: automatic) */
  rmmd_pinning pin;
} rmmd_buffer_options;

typedef enum rmmd_buffer_access {
  RMMD_BUFFER_READ       = 0, /* mapped read-only (CUDA: in hardware) */
  RMMD_BUFFER_READ_WRITE = 1  /* only where the creator allowed writers */
} rmmd_buffer_access;

typedef struct rmmd_open_options {
  size_t size; /* sizeof(rmmd_open_options) */
  uint32_t wait_ms;
  rmmd_buffer_access access;
  /* The fingerprint guard: labels the buffer must carry with exactly these
   * values (expect_keys[i] = expect_values[i], i < expect_count; each key
   * once). A mismatch is RMMD_ERROR_FAILED_PRECONDITION naming the first key
   * (in key order) that differs, and nothing is opened. */
  char const* const* expect_keys;
  char const* const* expect_values;
  size_t expect_count;
  /* A buffer of another node: the node's name as this node's rmmd.conf
   * names it (peering.peers); NULL or "": as the name says (NODE:NAME, or
   * this node). (0.5; callers built before, whose size is smaller: NULL) */
  char const* peer;
  /* nonzero: map on `device`, this process's CUDA device (as has_gid and
   * gid say a gid: options zeroed with {} or memset keep the current
   * device, not device 0). A buffer of another node is mapped there instead
   * of on the calling thread's current device; a process that sees no GPU,
   * or fewer than device + 1, is RMMD_ERROR_INVALID_ARGUMENT before any
   * request, and so is a device below 0. A buffer of this node is mapped
   * on its pool's device: a device that is not the pool's (or a host pool's
   * buffer) is RMMD_ERROR_INVALID_ARGUMENT, and nothing stays open.
   * (0.6; callers built before, whose size is smaller: 0, the current
   * device) */
  int has_device;
  int device;
  /* nonzero: take the buffer's write lease (docs/failover.md), with
   * access RMMD_BUFFER_READ_WRITE and a buffer of this node (else
   * RMMD_ERROR_INVALID_ARGUMENT before any request). While another session
   * holds it, waits up to wait_ms in line, first come first served, and is
   * granted when the holder closes its exclusive open or its session ends;
   * a wait that ends first is RMMD_ERROR_DEADLINE_EXCEEDED naming the
   * holder, and nothing is opened. rmmd_buffer_lease_generation says which
   * grant it is. (0.7; callers built before, whose size is smaller: 0) */
  int exclusive;
  /* The padding that ended 0.7's struct, named so that `standby` lies past
   * the size of 0.7's struct: ignored. */
  int reserved_0;
  /* nonzero, with exclusive: a standby (docs/failover.md, "A standby that
   * is ready"): the open does not wait for the lease (wait_ms still applies
   * to the buffer's publication) and returns at once with the buffer
   * mapped, holding the lease where it is free and standing in line for it
   * otherwise; the mapping is read-only until the grant where the memory
   * allows (a VMM allocation, a host buffer's memfd; a pool pointer is
   * read-write from the start). rmmd_buffer_wait_lease waits for the grant
   * and makes the same mapping read-write: the pointer does not change.
   * Without exclusive: RMMD_ERROR_INVALID_ARGUMENT. (0.8; callers built
   * before, whose size is smaller: 0) */
  int standby;
  /* The padding that ended 0.8's struct: ignored. */
  int reserved_1;
  /* A host buffer: page-locked here as rmmd_pinning says; with
   * RMMD_PINNING_REQUIRED an existing unlocked mapping of the same buffer
   * in this session is page-locked too. Another value:
   * RMMD_ERROR_INVALID_ARGUMENT before any request. (0.9; callers built
   * before, whose size is smaller: automatic) */
  rmmd_pinning pin;
} rmmd_open_options;

/* options may be NULL: the current device's pool, not persistent. */
RMMD_API rmmd_status rmmd_buffer_create(rmmd_session_t session,
                                        char const* name,
                                        size_t bytes,
                                        rmmd_buffer_options const* options,
                                        rmmd_buffer_t* buffer);
/* Waits up to wait_ms for the buffer to be created and published. */
RMMD_API rmmd_status rmmd_buffer_open(rmmd_session_t session,
                                      char const* name,
                                      uint32_t wait_ms,
                                      rmmd_buffer_t* buffer);
/* Publishes now (the creator's writes are complete). */
RMMD_API rmmd_status rmmd_buffer_publish(rmmd_buffer_t buffer);
/* Publishes once `stream` has done what is queued on it. */
RMMD_API rmmd_status rmmd_buffer_publish_on_stream(rmmd_buffer_t buffer, void* stream);
/* Lets go in `stream`'s order (NULL: the legacy default stream; host buffers
 * without a stream: at once) and destroys the handle. NULL is fine. */
RMMD_API rmmd_status rmmd_buffer_close(rmmd_buffer_t buffer, void* stream);
/* Lets go at once (host buffers) or on the legacy default stream. */
RMMD_API rmmd_status rmmd_buffer_destroy(rmmd_buffer_t buffer);
RMMD_API rmmd_status rmmd_buffer_pointer(rmmd_buffer_t buffer, void** ptr);
RMMD_API rmmd_status rmmd_buffer_size(rmmd_buffer_t buffer, size_t* bytes);
RMMD_API rmmd_status rmmd_buffer_id(rmmd_buffer_t buffer, uint64_t* id);
/* This process's CUDA ordinal of the buffer's GPU; -1 for host buffers. */
RMMD_API rmmd_status rmmd_buffer_device(rmmd_buffer_t buffer, int* device);
/* Deletes by name; holders: the sessions that still hold it. */
RMMD_API rmmd_status rmmd_buffer_delete(rmmd_session_t session, char const* name, size_t* holders);

/* Opens as `options` say (NULL: read-only, no wait, no guard). `name` is
 * NAME, or NODE:NAME for a buffer of another node of the NVLink domain,
 * opened through this node's daemon (peering in its rmmd.conf,
 * docs/operations.md "Across nodes") and mapped by its fabric handle on
 * options->device (the calling thread's current CUDA device by default),
 * read-only unless
 * RMMD_BUFFER_READ_WRITE was granted. A malformed address (':' twice, an
 * empty or invalid node) is RMMD_ERROR_INVALID_ARGUMENT before any request;
 * a peer whose grants do not name the buffer RMMD_ERROR_PERMISSION_DENIED;
 * a node that peering.peers does not name RMMD_ERROR_NOT_FOUND. */
RMMD_API rmmd_status rmmd_buffer_open_with(rmmd_session_t session,
                                           char const* name,
                                           rmmd_open_options const* options,
                                           rmmd_buffer_t* buffer);
/* Manifests (docs/sharing.md), as JSON in protobuf's JSON mapping of
 * rmmd.v1.BufferManifest: {"tensors": [{"name": "w", "dtype": "DTYPE_FLOAT16",
 * "shape": ["4096", "4096"], "byte_offset": "0"}], "labels": [{"key": "model",
 * "value": "gpt2"}]}
 * (64-bit integers may be strings or numbers; field names as in the proto,
 * byte_offset, or lowerCamelCase). Creator only, before publish. Bad JSON is
 * RMMD_ERROR_INVALID_ARGUMENT with the parser's reason; so is a table the
 * daemon refuses, naming the tensor or label. The JSON these functions
 * return has the proto's field names (byte_offset), every field (zeros and
 * empty lists too), 64-bit integers as strings and enums by name. */
RMMD_API rmmd_status rmmd_buffer_set_manifest_json(rmmd_buffer_t buffer, char const* json);
/* The manifest this open got ("{}" when none). Free with rmmd_string_free. */
RMMD_API rmmd_status rmmd_buffer_manifest_json(rmmd_buffer_t buffer, char** json);
/* RMMD_BUFFER_READ or RMMD_BUFFER_READ_WRITE (the creator's). */
RMMD_API rmmd_status rmmd_buffer_access_mode(rmmd_buffer_t buffer, rmmd_buffer_access* access);
/* The generation of the write lease this open holds (an exclusive open);
 * 0: it holds none. Larger for every later grant of the buffer's lease. */
RMMD_API rmmd_status rmmd_buffer_lease_generation(rmmd_buffer_t buffer, uint64_t* generation);
/* A standby open (rmmd_open_options.standby): waits up to timeout_ms (< 0:
 * without end) for the write lease and writes its generation (may be
 * NULL); at once where the open holds it already. At the grant the mapping
 * becomes read-write in place: rmmd_buffer_pointer's answer does not
 * change. RMMD_ERROR_DEADLINE_EXCEEDED when the wait ends first, naming the
 * holder: nothing changed, the standby stays in line.
 * RMMD_ERROR_FAILED_PRECONDITION: not a standby open; RMMD_ERROR_NOT_FOUND:
 * the buffer was deleted while it stood in line. */
RMMD_API rmmd_status rmmd_buffer_wait_lease(rmmd_buffer_t buffer,
                                            int64_t timeout_ms,
                                            uint64_t* generation);
/* Whether a host buffer is page-locked in this process (*pinned: 1 or 0;
 * 0 for device memory): rmmd_pinning says when it is. */
RMMD_API rmmd_status rmmd_buffer_pinned(rmmd_buffer_t buffer, int* pinned);
/* Whether this open holds the write lease (*holds: 1 or 0). */
RMMD_API rmmd_status rmmd_buffer_holds_lease(rmmd_buffer_t buffer, int* holds);
/* The buffers the caller may see, as the JSON of rmmd.v1.ListBuffersResponse:
 * those whose names start with name_prefix (NULL or "": any) and whose
 * manifests carry label_keys[i] = label_values[i] for every i < label_count.
 * Free with rmmd_string_free. */
RMMD_API rmmd_status rmmd_buffer_list_json(rmmd_session_t session,
                                           char const* name_prefix,
                                           char const* const* label_keys,
                                           char const* const* label_values,
                                           size_t label_count,
                                           char** json);
/* rmmd_buffer_list_json's listing of node `peer`'s buffers (as this node's
 * rmmd.conf names it in peering.peers; NULL or "": this node's, as
 * rmmd_buffer_list_json): those that node's grant lets this node open,
 * published and in a fabric pool, at most 4096 by name ("truncated": true
 * when more matched), each with "peer" set and no id, pool or creator.
 * RMMD_ERROR_NOT_FOUND for a node peering.peers does not name; a node that
 * cannot be reached now is RMMD_ERROR_UNAVAILABLE, its state in words. Free
 * with rmmd_string_free. */
RMMD_API rmmd_status rmmd_buffer_list_peer_json(rmmd_session_t session,
                                                char const* peer,
                                                char const* name_prefix,
                                                char const* const* label_keys,
                                                char const* const* label_values,
                                                size_t label_count,
                                                char** json);
/* Opens the one published buffer whose manifest carries label_keys[i] =
 * label_values[i] for every i < label_count (at least one), on
 * options->peer's node (NULL or "": this node), with those labels added to
 * options' fingerprint guard; otherwise as rmmd_buffer_open_with. None
 * carries them: RMMD_ERROR_NOT_FOUND naming the labels; several:
 * RMMD_ERROR_FAILED_PRECONDITION naming them. rmmd_buffer_name says which. */
RMMD_API rmmd_status rmmd_buffer_open_by_labels(rmmd_session_t session,
                                                char const* const* label_keys,
                                                char const* const* label_values,
                                                size_t label_count,
                                                rmmd_open_options const* options,
                                                rmmd_buffer_t* buffer);
/* The buffer's name (without its node). Free with rmmd_string_free. */
RMMD_API rmmd_status rmmd_buffer_name(rmmd_buffer_t buffer, char** name);
/* One buffer and its manifest, as the JSON of rmmd.v1.DescribeBufferResponse. */
RMMD_API rmmd_status rmmd_buffer_describe_json(rmmd_session_t session,
                                               char const* name,
                                               char** json);

/* ---- other nodes (docs/operations.md, "Across nodes") -------------------- */

/* The daemon's peers, as the JSON of rmmd.v1.ListPeersResponse:
 * {"node_name": "nodeB", "peers": [{"node_name": "nodeA", "state": "ready",
 * "probe_ok": true, "holds_we_have": 1, ...}]} (an empty "peers" where
 * peering is off). Free with rmmd_string_free. */
RMMD_API rmmd_status rmmd_peers_json(rmmd_session_t session, char** json);

/* ---- PyTorch's pluggable allocator (torch.cuda.memory.CUDAPluggableAllocator)
 *
 * One process-wide session and one device resource per device, made at the
 * first allocation from $RMMD_RUNTIME_DIR and $RMMD_TORCH_MODE ("slab", the
 * default, or "direct"), or from rmmd_torch_configure() called before it.
 * A failure returns NULL; the reason is rmmd_last_error_message() of that
 * thread. Under a torch.cuda.MemPool PyTorch's caching allocator then empties
 * its cache, retries and raises torch.OutOfMemoryError; as the whole
 * process's allocator (change_current_allocator) PyTorch does not check the
 * pointer (torch/csrc/cuda/CUDAPluggableAllocator.cpp in the 2.x sources read):
 * the tensor gets address 0 (docs/python.md). Nothing is printed at exit
 * and nothing is left behind. */
RMMD_API void* rmmd_torch_malloc(size_t size, int device, void* stream);
/* The same, for the whole process's allocator where the Python package's
 * shim (below) cannot be built: a failure throws a C++ std::runtime_error
 * with rmmd's message instead of returning NULL (which PyTorch would turn
 * into a tensor at address 0). PyTorch's bindings raise it as
 * RuntimeError("rmmd: ..."). The one function of this header that throws:
 * only for C++ callers that expect it (PyTorch). */
RMMD_API void* rmmd_torch_malloc_or_raise(size_t size, int device, void* stream);
RMMD_API void rmmd_torch_free(void* ptr, size_t size, int device, void* stream);
/* The allocation of both, with its status (RMMD_ERROR_OUT_OF_MEMORY, ...):
 * for an allocate function compiled against PyTorch that throws PyTorch's
 * own out-of-memory type (rmmd/allocators/_torch_oom.cpp of the Python
 * package, which use_rmmd_as_allocator() builds on the node). */
RMMD_API rmmd_status rmmd_torch_allocate(size_t size, int device, void* stream, void** ptr);
/* runtime_dir NULL: $RMMD_RUNTIME_DIR or /run/rmmd. FAILED_PRECONDITION once
 * the first allocation was made. */
RMMD_API rmmd_status rmmd_torch_configure(char const* runtime_dir, rmmd_allocation_mode mode);
/* The stats of the process-wide resource of `device`; NOT_FOUND before its
 * first allocation. */
RMMD_API rmmd_status rmmd_torch_get_stats(int device, rmmd_resource_stats* stats);

/* ---- address-stable memory, sleep and wake (docs/sleep.md) ------------- */

/* rmmd::stable_memory_resource: allocations the daemon makes in a CUDA pool,
 * mapped by this process at addresses it keeps across sleep and wake. */
typedef struct rmmd_stable_resource_s* rmmd_stable_resource_t;

typedef enum rmmd_sleep_backup {
  RMMD_SLEEP_BACKUP_NONE = 0, /* the contents are dropped (a KV cache) */
  RMMD_SLEEP_BACKUP_HOST = 1  /* copied to host memory the daemon holds */
} rmmd_sleep_backup;

/* device: this process's ordinal (-1: current); pool: a CUDA pool by name
 * (NULL: by device); default_tag: NULL is "default". */
RMMD_API rmmd_status rmmd_stable_resource_create(rmmd_session_t session,
                                                 int device,
                                                 char const* pool,
                                                 char const* default_tag,
                                                 rmmd_stable_resource_t* resource);
/* Frees what is still allocated from it. NULL is fine. */
RMMD_API rmmd_status rmmd_stable_resource_destroy(rmmd_stable_resource_t resource);
/* tag NULL: the calling thread's tag (rmmd_stable_set_thread_tag), else the
 * resource's default. bytes 0 gives NULL. */
RMMD_API rmmd_status rmmd_stable_allocate(rmmd_stable_resource_t resource,
                                          size_t bytes,
                                          char const* tag,
                                          void** ptr);
/* Waits for `stream` (NULL: the legacy default stream), then unmaps and frees. */
RMMD_API rmmd_status rmmd_stable_deallocate(rmmd_stable_resource_t resource,
                                            void* ptr,
                                            size_t bytes,
                                            void* stream);
/* The calling thread's tag for allocations without one (torch_memory_saver's
 * region); NULL or "" clears it. */
RMMD_API rmmd_status rmmd_stable_set_thread_tag(char const* tag);
/* Sleeps the allocations tagged with one of `tags` (tag_count 0: every tag):
 * backups copied on `stream`, memory unmapped (addresses kept) and given
 * back. backup_name (NULL: none) keeps host backups past this process for
 * rmmd_stable_restore. *released_bytes (may be NULL): device bytes given back. */
RMMD_API rmmd_status rmmd_stable_sleep(rmmd_stable_resource_t resource,
                                       char const* const* tags,
                                       size_t tag_count,
                                       rmmd_sleep_backup backup,
                                       char const* backup_name,
                                       void* stream,
                                       uint64_t* released_bytes);
/* Wakes them at the same addresses, all or none, restoring backups on
 * `stream`; a wake that does not fit waits up to deadline_ms, then
 * RMMD_ERROR_OUT_OF_MEMORY naming who holds the pool, nothing mapped.
 * *woken_bytes may be NULL. */
RMMD_API rmmd_status rmmd_stable_wake(rmmd_stable_resource_t resource,
                                      char const* const* tags,
                                      size_t tag_count,
                                      uint32_t deadline_ms,
                                      void* stream,
                                      uint64_t* woken_bytes);
/* Takes over the allocations a process of this uid left asleep under
 * backup_name, woken at new addresses and restored, as JSON:
 * [{"ptr":140..., "size":..., "tag":"weights"}, ...] (free with
 * rmmd_string_free); free each with rmmd_stable_deallocate. */
RMMD_API rmmd_status rmmd_stable_restore(rmmd_stable_resource_t resource,
                                         char const* backup_name,
                                         uint32_t deadline_ms,
                                         void* stream,
                                         char** json);
/* Copies `bytes` bytes at `ptr`, inside one of the resource's allocations
 * that sleeps with a host backup, from that backup into `out` (host memory,
 * `bytes` long). *copied: `bytes`, or 0 where that allocation is awake or
 * sleeps without a backup (nothing is copied then). RMMD_ERROR_NOT_FOUND
 * where [ptr, ptr + bytes) is not inside one of the resource's allocations. */
RMMD_API rmmd_status rmmd_stable_read_backup(
    rmmd_stable_resource_t resource, void const* ptr, size_t bytes, void* out, size_t* copied);
/* Whether a wake keeps the host backups it restored from (nonzero, the
 * default) as the room of the next sleep with a backup, mapped and
 * page-locked in this process and charged to the host pool and the uid's
 * quota while awake, so that later sleeps and wakes are the copies alone;
 * 0: a wake gives the host memory back (stable_memory_resource::keep_backups). */
RMMD_API rmmd_status rmmd_stable_keep_backups(rmmd_stable_resource_t resource, int keep);
/* Frees the backups kept under backup_name. */
RMMD_API rmmd_status rmmd_stable_drop_backups(rmmd_session_t session,
                                              char const* backup_name,
                                              uint64_t* dropped_bytes);
/* Who sleeps on the node (rmmd.v1.ListSleepersResponse, as rmmctl sleepers
 * --json prints it). Free with rmmd_string_free. */
RMMD_API rmmd_status rmmd_stable_sleepers_json(rmmd_session_t session, char** json);

/* ---- PyTorch's pluggable allocator over address-stable memory ----------
 *
 * What rmmd.memory_saver (torch_memory_saver's API) loads into a
 * torch.cuda.MemPool: allocations from one process-wide
 * rmmd_stable_resource_t per device, over the process-wide session of the
 * rmmd_torch_* functions above (made at the first call from
 * $RMMD_RUNTIME_DIR, or rmmd_torch_configure's runtime_dir), each tagged
 * with the calling thread's tag (rmmd_stable_set_thread_tag), else
 * "default". A failure returns NULL (PyTorch's caching allocator then
 * raises torch.OutOfMemoryError); the reason is rmmd_last_error_message()
 * of that thread. The free waits for `stream`, then unmaps. Nothing is
 * printed at exit and nothing is left behind. */
RMMD_API void* rmmd_torch_stable_malloc(size_t size, int device, void* stream);
RMMD_API void rmmd_torch_stable_free(void* ptr, size_t size, int device, void* stream);
/* A new handle on the process-wide stable resource of `device` (made if
 * need be), for rmmd_stable_sleep, _wake, _restore and _read_backup of its
 * allocations. rmmd_stable_resource_destroy of it frees nothing: the
 * process-wide resource keeps its allocations for the process's life. */
RMMD_API rmmd_status rmmd_torch_stable_resource(int device, rmmd_stable_resource_t* resource);
/* The devices that have a process-wide stable resource: bit d of *devices
 * for device d (0 to 63). */
RMMD_API rmmd_status rmmd_torch_stable_devices(uint64_t* devices);

#ifdef __cplusplus
}
#endif

#endif /* RMMD_RMMD_H */
