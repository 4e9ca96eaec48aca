#pragma once
/// \file
/// corodist::ddp::iteration_stats: what one reducer iteration did and how long it took.

#include <corodist/core/config.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace corodist::ddp {

/// Figures of one iteration (`reducer::last_stats()` after `finalize()`).
/// Times are steady-clock durations measured on this rank.
struct iteration_stats {
  /// One bucket's figures.
  struct bucket {
    /// Bucket size in bytes.
    std::size_t bytes = 0;
    /// From the bucket's last gradient being processed (the bucket complete)
    /// to its reduced values being in place.
    std::chrono::nanoseconds ready_to_reduced{0};
    /// From launching the bucket's reduction (allreduce or hook) to its end.
    std::chrono::nanoseconds communication{0};
  };

  /// The iteration's number (0 for the first, counting no_sync ones too).
  std::uint64_t iteration = 0;
  /// False for an iteration inside no_sync() (nothing communicated).
  bool synchronized = true;
  std::vector<bucket> buckets;
  /// Wall time during which at least one of the iteration's collectives
  /// (buffers, buckets, used-parameter bitmap, rebuild) was in flight.
  std::chrono::nanoseconds communication{0};
  /// The part of `communication` before `finalize()` was called (while the
  /// caller was still computing): communication hidden behind computation.
  std::chrono::nanoseconds overlapped{0};
  /// From `prepare_for_backward()` to the call of `finalize()`.
  std::chrono::nanoseconds backward{0};
  /// From the call of `finalize()` to its return (the wait the caller sees).
  std::chrono::nanoseconds finalize_wait{0};
  /// Bytes copied between registered gradients and buckets (0 with gradient_as_bucket_view).
  std::size_t copied_bytes = 0;
  /// Parameters no rank used (find_unused_parameters).
  std::size_t globally_unused = 0;
  /// True when the buckets were rebuilt at the end of this iteration.
  bool rebuilt = false;

  /// `overlapped / communication` (0 without communication).
  double overlap_ratio() const noexcept {
    return communication.count() > 0 ? static_cast<double>(overlapped.count()) / static_cast<double>(communication.count())
                                     : 0.0;
  }
};

} // namespace corodist::ddp
