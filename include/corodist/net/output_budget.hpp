#pragma once
/// \file
/// corodist::net::output_budget: one cap on the unwritten output of a group of connections.

#include <corodist/core/config.hpp>

#include <atomic>
#include <cstddef>

namespace corodist::net {

/// A cap in bytes on the output queued, and not yet handed to the socket, by
/// every connection that shares it (`connection_options::shared_output`), e.g.
/// all of one RPC agent's. When a frame takes the total over the cap, the
/// connection queueing it is dropped as a peer that does not read if it holds a
/// quarter of the cap or more (otherwise the frame is queued, and the peers that
/// hold the most are dropped as they queue). Thread-safe.
class output_budget {
public:
  /// A budget of `limit` bytes.
  explicit output_budget(std::size_t limit) noexcept : limit_(limit) {}
  output_budget(const output_budget&) = delete;
  output_budget& operator=(const output_budget&) = delete;

  /// The cap in bytes.
  std::size_t limit() const noexcept { return limit_; }
  /// Bytes queued now by the connections that share it.
  std::size_t used() const noexcept { return used_.load(std::memory_order_relaxed); }

  /// Counts `n` more bytes; returns the new total.
  std::size_t add(std::size_t n) noexcept { return used_.fetch_add(n, std::memory_order_relaxed) + n; }
  /// Counts `n` bytes fewer.
  void remove(std::size_t n) noexcept { used_.fetch_sub(n, std::memory_order_relaxed); }

private:
  const std::size_t limit_;
  std::atomic<std::size_t> used_{0};
};

} // namespace corodist::net
