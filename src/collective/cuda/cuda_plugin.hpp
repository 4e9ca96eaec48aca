#pragma once
// The seam between libcorodist and libcorodist-cuda, the plugin that holds
// every call into CUDA and NCCL: libcorodist links neither, and loads the
// plugin with dlopen the first time a CUDA feature is asked for, so that a
// CPU-only program never loads (or needs) the CUDA libraries.

#include <corodist/collective/nccl_group.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace corodist::collective::detail {

/// One NCCL communicator of an nccl_group, implemented in the plugin.
class nccl_backend {
public:
  virtual ~nccl_backend() = default;
  /// Validates and enqueues `call`; returns its work (see nccl_group).
  virtual work submit(collective_call call) = 0;
  virtual std::uint64_t sequence_number() const noexcept = 0;
  virtual void abort(const std::string& reason) = 0;
  virtual bool aborted() const noexcept = 0;
  virtual int cuda_device() const noexcept = 0;
  virtual void* stream() const noexcept = 0;
  /// The options the communicator was made with (the device resolved).
  virtual const nccl_options& options() const noexcept = 0;
  /// "" when `shrink` can run (see nccl_group::shrink_unavailable_reason).
  virtual std::string shrink_unavailable_reason() const = 0;
  /// A new communicator of the ranks not in `excluded` (sorted, in range,
  /// without this rank, fewer than all; checked by nccl_group::shrink).
  virtual asio::awaitable<std::shared_ptr<nccl_backend>> shrink(std::vector<int> excluded, nccl_options opts) = 0;
  /// A communicator of the ranks that pass the same `color` (>= 0), ordered
  /// by (`key`, rank), with ncclCommSplit; null for `no_color`. Every rank of
  /// this one calls it (arguments checked by nccl_group::split).
  virtual asio::awaitable<std::shared_ptr<nccl_backend>> split(int color, int key, corodist::timeout timeout,
                                                               std::string name) = 0;
  /// This rank in the communicator, and its number of ranks.
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  /// The nccl_group is gone: abort if collectives are still in flight (the
  /// poller, which holds the backend, fails them and lets it go).
  virtual void group_destroyed() noexcept = 0;
};

/// The CUDA runtime calls behind cuda_stream, cuda_event and device_buffer.
/// Handles are the runtime's own (`cudaStream_t`, `cudaEvent_t`) as void*;
/// `device` is the ordinal each call first makes current (-1: none, host
/// memory). Every call but the `noexcept` ones throws `cuda_error` naming the
/// call and CUDA's text.
struct cuda_runtime {
  int (*device_count)() noexcept = nullptr;
  void* (*stream_create)(int device) = nullptr;
  void (*stream_destroy)(int device, void* stream) noexcept = nullptr;
  void (*stream_synchronize)(int device, void* stream) = nullptr;
  void (*stream_wait_event)(int device, void* stream, void* event) = nullptr;
  void* (*event_create)(int device) = nullptr;
  void (*event_destroy)(int device, void* event) noexcept = nullptr;
  void (*event_record)(int device, void* event, void* stream) = nullptr;
  /// True when complete.
  bool (*event_query)(int device, void* event) = nullptr;
  void (*event_synchronize)(int device, void* event) = nullptr;
  void (*copy_async)(int device, void* dst, const void* src, std::size_t bytes, void* stream) = nullptr;
  void (*zero_async)(int device, void* dst, std::size_t bytes, void* stream) = nullptr;
  /// cuda_stream::convert (dtypes as collective::dtype values; checked by the caller).
  void (*convert_async)(int device, const void* src, std::uint8_t src_type, void* dst, std::uint8_t dst_type,
                        std::size_t count, int divisor, void* stream) = nullptr;
  /// Device memory of `device`, or page-locked host memory for device -1.
  void* (*allocate)(int device, std::size_t bytes) = nullptr;
  void (*release)(int device, void* p) noexcept = nullptr;
  void* (*allocate_async)(int device, std::size_t bytes, void* stream) = nullptr;
  void (*release_async)(int device, void* p, void* stream) noexcept = nullptr;
  /// cudaStreamLegacy.
  void* legacy_stream = nullptr;
};

/// What the plugin exports, as one table (its only entry point is
/// `corodist_cuda_plugin_v1`). Both sides come from the same build; `abi`
/// guards against a plugin of another build found on the search path.
struct cuda_plugin {
  static constexpr std::uint32_t abi = 4; // 2: nccl_backend::shrink; 3: the runtime table; 4: split, rank, size

  std::uint32_t abi_version = abi;
  /// "" when NCCL can run here, else why not ("no CUDA device: ...").
  std::string (*unavailable_reason)() = nullptr;
  /// Rendezvous and communicator creation (arguments already checked).
  asio::awaitable<std::shared_ptr<nccl_backend>> (*create_nccl)(asio::any_io_executor ex,
                                                                std::shared_ptr<store::store> store, int rank,
                                                                int size, nccl_options opts) = nullptr;
  /// Streams, events, copies, kernels and memory.
  const cuda_runtime* runtime = nullptr;
};

/// The plugin's runtime table (defined in the plugin only: cuda_runtime.cpp).
const cuda_runtime* plugin_runtime() noexcept;

/// The runtime table of the loaded plugin; throws `cuda_error` with the
/// reason when CUDA cannot be used here (not built, not loadable, no device).
const cuda_runtime& cuda_runtime_or_throw();

/// The file name of the plugin.
inline constexpr const char* cuda_plugin_file = "libcorodist-cuda.so";

/// The plugin, loaded on first use (from the directory of libcorodist itself,
/// else the loader's search path) and kept for the life of the process; null
/// if it cannot be loaded, with the reason in `why`. Thread-safe.
const cuda_plugin* load_cuda_plugin(std::string& why);

} // namespace corodist::collective::detail

/// The plugin's entry point.
extern "C" const corodist::collective::detail::cuda_plugin* corodist_cuda_plugin_v1();
