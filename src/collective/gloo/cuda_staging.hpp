#pragma once
// gloo_group's CUDA buffers, staged through page-locked host memory (as
// PyTorch's ProcessGroupGloo does): at issue, device -> pinned host copies on
// the group's stream of that device, ordered after the caller's stream; on the
// communication thread, a wait for them, Gloo on the host copies, and the
// results copied back to the device before the work completes.

#include <corodist/collective/cuda_event.hpp>
#include <corodist/collective/cuda_stream.hpp>
#include <corodist/collective/device_buffer.hpp>
#include <corodist/collective/process_group.hpp>

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace corodist::collective::detail {

/// A gloo_group's staging resources: one stream per CUDA device, and pinned
/// host buffers kept for reuse (a reducer stages the same bucket sizes every
/// iteration; page-locking memory costs milliseconds). Thread-safe.
class staging_pool {
public:
  /// The group's stream on `device` (made on first use).
  cuda_stream stream(int device);
  /// A pinned buffer of at least `bytes` (a kept one when one fits).
  device_buffer take(std::size_t bytes);
  /// Keeps `b` for reuse.
  void give(device_buffer b);

private:
  static constexpr std::size_t kept_max = 64;

  std::mutex mutex_;
  std::map<int, cuda_stream> streams_;
  std::multimap<std::size_t, device_buffer> free_; // by size
};

/// The staging of one collective's CUDA buffers.
class cuda_staging {
public:
  /// When `call`'s buffers are on a CUDA device: queues their copies to
  /// pinned host buffers after the work on `call.stream`, and points `call`
  /// at the host buffers; returns the staging. Null for host buffers. Throws
  /// `cuda_error` (CUDA unusable here, a CUDA failure).
  static std::unique_ptr<cuda_staging> stage(collective_call& call, std::shared_ptr<staging_pool> pool);

  /// Returns the pinned buffers to the pool.
  ~cuda_staging();

  /// On the communication thread, before the collective: waits until the
  /// copies to the host are done. Throws `timeout_error` ("Timed out ...") at
  /// `deadline`, `cuda_error` when they failed.
  void before(std::chrono::steady_clock::time_point deadline);

  /// After the collective succeeded: copies the results back to the device
  /// and waits until they are there (bounded as `before`).
  void after(std::chrono::steady_clock::time_point deadline);

private:
  struct staged {
    tensor_view device_view;
    device_buffer host;
    bool output = false;
  };

  cuda_staging(std::shared_ptr<staging_pool> pool, cuda_stream s) : pool_(std::move(pool)), stream_(std::move(s)) {}

  std::shared_ptr<staging_pool> pool_;
  cuda_stream stream_;
  std::vector<staged> buffers_;
  cuda_event copied_;
};

} // namespace corodist::collective::detail
