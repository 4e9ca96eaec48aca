#pragma once
// The process-wide atomics behind net::connection_counters_snapshot(), bumped
// by the connection's open, close and heartbeat code.

#include <atomic>
#include <cstdint>

namespace corodist::net::detail {

struct connection_counting {
  std::atomic<std::uint64_t> opened{0};
  std::atomic<std::uint64_t> closed{0};
  std::atomic<std::uint64_t> lost{0};
  std::atomic<std::uint64_t> heartbeats_missed{0};
};

/// The process's counters.
connection_counting& counting() noexcept;

/// Adds one to `c` (relaxed: a count, ordering nothing).
inline void bump(std::atomic<std::uint64_t>& c) noexcept { c.fetch_add(1, std::memory_order_relaxed); }

} // namespace corodist::net::detail
