#pragma once
/// \file
/// The reducer's figures for the metrics: a DDP reducer hands each
/// synchronized iteration's stats here (per-bucket ready-to-done times,
/// communication and how much of it overlapped the backward pass). Costs one
/// atomic load when the metrics server is not running.

#include <corodist/core/config.hpp>

#include <chrono>
#include <span>

namespace corodist::metrics {

/// One synchronized reducer iteration, as ddp::iteration_stats has it.
struct reducer_iteration {
  /// Each bucket's time from ready (its last gradient in) to reduced, by bucket index.
  std::span<const std::chrono::nanoseconds> bucket_ready_to_done;
  /// Wall time with at least one collective of the iteration in flight.
  std::chrono::nanoseconds communication{0};
  /// The part of `communication` before finalize() was called.
  std::chrono::nanoseconds overlapped{0};
  /// From the call of finalize() to its return.
  std::chrono::nanoseconds finalize_wait{0};
};

/// True while metrics are counted (the server runs); a reducer checks it before
/// building a `reducer_iteration`. Thread-safe.
bool counting() noexcept;

/// Counts one iteration (no-op when not counting). Thread-safe, never throws.
void note_reducer_iteration(const reducer_iteration& it) noexcept;

} // namespace corodist::metrics
