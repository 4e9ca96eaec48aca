#pragma once
/// \file
/// A cheap read of the steady clock, for liveness bookkeeping.

#include <chrono>
#include <ctime>

namespace corodist::detail {

/// steady_clock's time as of the kernel's last tick (CLOCK_MONOTONIC_COARSE:
/// the same timeline as steady_clock, never ahead of it, at most one tick --
/// 1 to 10 ms -- behind), at a quarter of the cost of steady_clock::now().
/// For timestamps that are only compared with spans of many ticks (a
/// connection's last read and write, against its peer_timeout).
inline std::chrono::steady_clock::time_point coarse_now() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::seconds(ts.tv_sec) +
                                                                      std::chrono::nanoseconds(ts.tv_nsec)));
}

} // namespace corodist::detail
