#pragma once
/// \file
/// corodist::rpc::stream_stats: what one end of a stream has sent, received and
/// holds, for tests, diagnostics and flow-control checks.

#include <corodist/core/config.hpp>

#include <cstddef>
#include <cstdint>

namespace corodist::rpc {

/// Counters of one end of a stream (a snapshot, read on the agent's loop).
struct stream_stats {
  /// Items handed to the connection by this end's writer.
  std::uint64_t items_sent = 0;
  /// Items that arrived for this end's reader.
  std::uint64_t items_received = 0;
  /// Times this end's writer found its window spent and waited for credit.
  std::uint64_t credit_waits = 0;
  /// Items (and their bytes) sent and not yet given back as credit by the
  /// reader: never more than the reader's window (items; bytes: the window
  /// plus one item).
  std::size_t items_unacknowledged = 0;
  std::size_t bytes_unacknowledged = 0;
  /// Items written and waiting in this end's batch, not yet handed to the connection.
  std::size_t items_batched = 0;
  /// Items arrived and not yet read by this end's reader.
  std::size_t items_buffered = 0;
};

} // namespace corodist::rpc
