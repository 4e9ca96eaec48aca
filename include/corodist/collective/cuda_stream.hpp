#pragma once
/// \file
/// corodist::collective::cuda_stream: a CUDA stream of one device, and the
/// asynchronous work the library queues on streams (copies, dtype
/// conversions, event records and waits) — without linking CUDA: the calls
/// go to the CUDA plugin, loaded on first use.

#include <corodist/core/config.hpp>

#include <corodist/collective/cuda_event.hpp>
#include <corodist/collective/tensor_view.hpp>

#include <cstddef>
#include <memory>
#include <string>

namespace corodist::collective {

namespace detail {
struct cuda_stream_handle;
} // namespace detail

/// A CUDA stream (`cudaStream_t`) of device `device()`: owned (`create`,
/// destroyed with the last copy) or the caller's (`borrow`, never destroyed).
/// Every call queues work and returns at once, unless it says otherwise;
/// errors of queued work show in a later event's `ready()` / `wait()`.
/// Thread-safe as CUDA's own calls are. Every call throws `cuda_error` when
/// CUDA cannot be used here (see `unavailable_reason`) or a CUDA call fails.
class cuda_stream {
public:
  /// "" when CUDA can be used here: this build has the CUDA plugin, it loads,
  /// and a device is present. Else the reason ("no CUDA device: ...",
  /// "this corodist was built without CUDA ...").
  static std::string unavailable_reason();

  /// The number of CUDA devices (0 when CUDA cannot be used here).
  static int device_count() noexcept;

  /// A new non-blocking stream on `device` (`cudaStreamNonBlocking`: it does
  /// not wait for the legacy default stream).
  static cuda_stream create(int device);

  /// The caller's stream `handle` (a `cudaStream_t` of `device`; null: the
  /// legacy default stream, `cudaStreamLegacy`). Not destroyed by this object.
  static cuda_stream borrow(int device, void* handle);

  /// The CUDA device ordinal.
  int device() const noexcept;

  /// The `cudaStream_t` (`cudaStreamLegacy` for the legacy default stream).
  void* native() const noexcept;

  /// A new event recorded at this point of the stream.
  [[nodiscard]] cuda_event record() const;

  /// Records `e` (an event of this device) at this point of the stream,
  /// again: no allocation.
  void record(const cuda_event& e) const;

  /// Work queued on this stream from now on starts after `e` completed (no
  /// host wait). An empty event is ignored.
  void wait(const cuda_event& e) const;

  /// Copies `bytes` from `src` to `dst` (device or host memory, not
  /// overlapping; `cudaMemcpyAsync` with `cudaMemcpyDefault`). With pageable
  /// host memory CUDA may return only once the copy is done.
  void copy(void* dst, const void* src, std::size_t bytes) const;

  /// Sets `bytes` at `dst` (device memory) to zero.
  void zero(void* dst, std::size_t bytes) const;

  /// dst[i] = src[i] / divisor in dst's dtype, for i < src.count(), on the
  /// device (a kernel): float32, float64, float16 and bfloat16 in either
  /// place. Both of one dtype of 32 or 64 bits: divided in that dtype;
  /// otherwise in float32 and rounded to nearest even — the same bits as the
  /// host reducer's. `dst` may be `src`; the counts must match. Throws
  /// `usage_error` for other dtypes, host memory or mismatched views.
  void convert(const tensor_view& src, const tensor_view& dst, int divisor = 1) const;

  /// Blocks the calling thread until all work queued so far has completed.
  void synchronize() const;

private:
  explicit cuda_stream(std::shared_ptr<detail::cuda_stream_handle> h) noexcept : handle_(std::move(h)) {}

  std::shared_ptr<detail::cuda_stream_handle> handle_;
};

} // namespace corodist::collective
