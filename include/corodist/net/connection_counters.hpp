#pragma once
/// \file
/// corodist::net::connection_counters: process-wide counts of connections
/// opened, closed and lost, and of heartbeats missed, kept by every
/// `net::connection` (relaxed atomic increments at open, close and on the
/// heartbeat wheel's visits; nothing per frame). The metrics read them at
/// scrape time.

#include <corodist/core/config.hpp>

#include <cstdint>

namespace corodist::net {

/// Counts since the process started.
struct connection_counters {
  /// Connections started (`connection::start`), both directions.
  std::uint64_t opened = 0;
  /// Started connections that have closed, for any reason.
  std::uint64_t closed = 0;
  /// Of `closed`: those closed by a fault rather than an orderly end: the peer
  /// silent for peer_timeout, not reading (output overflow), a truncated,
  /// stalled or oversized frame, or a read error other than end of stream.
  std::uint64_t lost = 0;
  /// Heartbeat-wheel visits that found a started connection's peer silent for
  /// more than half its peer_timeout (two heartbeat periods): at least one
  /// heartbeat the peer should have sent did not come.
  std::uint64_t heartbeats_missed = 0;
};

/// A snapshot of the process's counters (each read on its own; relaxed).
/// Thread-safe, never throws.
connection_counters connection_counters_snapshot() noexcept;

} // namespace corodist::net
