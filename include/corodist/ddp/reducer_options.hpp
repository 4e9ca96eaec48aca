#pragma once
/// \file
/// corodist::ddp::reducer_options: the reducer's settings and their defaults.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <corodist/collective/tensor_view.hpp>

#include <chrono>
#include <cstddef>
#include <vector>

namespace corodist::ddp {

/// Settings of a reducer (PyTorch DistributedDataParallel's arguments of the
/// same names). Defaults are the named constants.
struct reducer_options {
  static constexpr std::size_t default_bucket_cap_bytes = std::size_t{25} << 20;
  static constexpr std::size_t default_first_bucket_bytes = std::size_t{1} << 20;

  /// A bucket is closed once it holds at least this many bytes (DDP's bucket_cap_mb).
  std::size_t bucket_cap_bytes = default_bucket_cap_bytes;
  /// The same for the first bucket of each dtype and device (small, so that
  /// communication starts early in the backward).
  std::size_t first_bucket_bytes = default_first_bucket_bytes;
  /// Gradients live in the buckets' memory (`reducer::gradient(i)`): no copy
  /// into buckets before the allreduce nor back after it. Off: the reducer
  /// copies each registered gradient into its bucket when it is marked ready
  /// and the averaged values back when the bucket is reduced.
  bool gradient_as_bucket_view = false;
  /// Parameters the caller does not declare used in `prepare_for_backward`
  /// count as ready at once (their share of the bucket is zero), and the
  /// ranks allreduce which parameters were used, so that all agree on the
  /// globally unused ones (whose gradients are then left untouched).
  bool find_unused_parameters = false;
  /// Broadcast `buffers` from rank 0 at construction and at the start of
  /// every synchronised iteration.
  bool broadcast_buffers = true;
  /// Model buffers (running statistics, ...): kept identical to rank 0's.
  std::vector<collective::tensor_view> buffers;
  /// After the first synchronised iteration, rebuild the buckets once from the
  /// order in which rank 0 saw gradients become ready (all ranks switch together).
  bool rebuild_buckets = true;
  /// Time limit of each collective of an iteration (the buckets' allreduces,
  /// the used-parameter bitmap, the buffers' broadcast, the rebuild's order);
  /// `inherit()` (the default): the group's timeout. Construction's
  /// collectives always wait up to the group's timeout: ranks reach
  /// construction at their own pace.
  corodist::timeout timeout = corodist::timeout::inherit();
  /// CUDA parameters: the stream their gradients are produced on (the
  /// backward's `cudaStream_t`; null: the device's legacy default stream).
  /// Each gradient's copy into its bucket is ordered after the work queued on
  /// it when the gradient is marked ready, and the work queued on it after
  /// finalize() returned is ordered after the averaged gradients (no host
  /// wait). With CUDA parameters on several devices leave it null.
  void* stream = nullptr;
};

} // namespace corodist::ddp
