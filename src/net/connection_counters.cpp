// The process-wide connection counters (net/connection_counting.hpp) and their snapshot.
#include <corodist/net/connection_counters.hpp>

#include "net/connection_counting.hpp"

namespace corodist::net {

namespace detail {

connection_counting& counting() noexcept {
  static connection_counting c;
  return c;
}

} // namespace detail

connection_counters connection_counters_snapshot() noexcept {
  auto& c = detail::counting();
  connection_counters s;
  s.opened = c.opened.load(std::memory_order_relaxed);
  s.closed = c.closed.load(std::memory_order_relaxed);
  s.lost = c.lost.load(std::memory_order_relaxed);
  s.heartbeats_missed = c.heartbeats_missed.load(std::memory_order_relaxed);
  return s;
}

} // namespace corodist::net
