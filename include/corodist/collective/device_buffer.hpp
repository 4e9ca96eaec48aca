#pragma once
/// \file
/// corodist::collective::device_buffer: memory owned on a CUDA device, or
/// page-locked host memory for staging copies.

#include <corodist/core/config.hpp>

#include <corodist/collective/cuda_stream.hpp>
#include <corodist/collective/device.hpp>

#include <cstddef>
#include <optional>

namespace corodist::collective {

namespace detail {
struct cuda_runtime;
} // namespace detail

/// `bytes()` of memory in `where()`: device memory (`device::cuda(i)`,
/// `cudaMalloc`, or `cudaMallocAsync` on a stream) or page-locked host memory
/// (`device::cpu()`, `cudaHostAlloc`, for copies that run asynchronously).
/// Move-only; freed at destruction (stream-ordered memory on its stream, with
/// no host wait). Throws `cuda_error` when CUDA cannot be used here or the
/// allocation fails.
class device_buffer {
public:
  /// No memory.
  device_buffer() = default;

  /// `bytes` of device memory of `where` (a CUDA device), or of page-locked
  /// host memory (`device::cpu()`). Contents undefined.
  static device_buffer allocate(device where, std::size_t bytes);

  /// `bytes` of device memory of `s`'s device, allocated and later freed in
  /// `s`'s order (`cudaMallocAsync` / `cudaFreeAsync`): usable by work queued
  /// on `s` after this call, freed after the work queued on it before the
  /// destruction. For short-lived scratch memory on a hot path.
  static device_buffer allocate_async(const cuda_stream& s, std::size_t bytes);

  device_buffer(device_buffer&& o) noexcept;
  device_buffer& operator=(device_buffer&& o) noexcept;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer();

  /// The memory (null when none).
  void* data() const noexcept { return data_; }
  /// Its size.
  std::size_t bytes() const noexcept { return bytes_; }
  /// Where it lives.
  device where() const noexcept { return where_; }

  /// Gives the memory up without freeing it (`data()` becomes null): for
  /// memory that failed device work may still touch (a collective that timed
  /// out), where freeing it could hand it to someone else while it is written.
  void leak() noexcept;

private:
  void release() noexcept;

  const detail::cuda_runtime* runtime_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  device where_{};
  std::optional<cuda_stream> order_; // allocate_async: freed on this stream
};

} // namespace corodist::collective
