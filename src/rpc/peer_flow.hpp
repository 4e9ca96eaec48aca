#pragma once
// Flow control of the calls one peer makes on one connection (private): the
// memory held for the peer -- its replies queued and being written, replies
// encoded and on their way to the loop, and its calls running, each at twice
// the largest reply sent to it so far (the value and its encoding) -- stays
// within max_buffered_output_per_peer. A call that would take it over waits,
// not started, and the connection stops reading (the peer's sends block),
// until its output drains.

#include <corodist/core/unique_function.hpp>
#include <corodist/net/connection.hpp>

#include <atomic>
#include <cstddef>
#include <deque>
#include <memory>

namespace corodist::rpc::detail {

/// Loop-affine, except encoded() and may_run().
class peer_flow : public std::enable_shared_from_this<peer_flow> {
public:
  /// Starts a call once admitted. It finds out itself whether it is to run
  /// (the connection may have closed, the agent may stop meanwhile); every
  /// call admitted ends with finished().
  using start_fn = corodist::unique_function<void()>;

  /// The calls arriving on `conn`, whose output is capped at `cap` bytes.
  peer_flow(const std::shared_ptr<net::connection>& conn, std::size_t cap);

  /// Whether this flow is `c`'s (a connection at the same address is another one).
  bool serves(const net::connection* c) const;
  /// Whether the peer's output admits one more call now, with none waiting
  /// before it; if so the call counts as admitted (it ends with finished()).
  bool admit_now();
  /// Queues `s`, a call that admit_now() did not admit, and pauses the
  /// connection's reading until it is started.
  void submit(start_fn s);
  /// A call's reply of `n` bytes has been encoded (any thread): counted until finished().
  void encoded(std::size_t n) noexcept;
  /// A call admitted is over: its reply, of `n` bytes counted by encoded()
  /// (0: none was), is queued on the connection or dropped.
  void finished(std::size_t n);
  /// Whether a call admitted before its peer's reply size was known may run
  /// now (any thread): false if, at the largest reply seen since, the calls
  /// admitted would take the peer's output over the cap; the call then goes
  /// back with requeue().
  bool may_run() const noexcept;
  /// A call admitted but not run (may_run() was false) waits again, first in line.
  void requeue(start_fn s);
  /// Whether the connection has closed (any thread; as last seen on the loop).
  bool closed() const noexcept { return closed_.load(std::memory_order_relaxed); }
  /// Starts every waiting call, admitted or not (the agent stops: each answers at once).
  void release_all();
  /// No call admitted or waiting.
  bool idle() const noexcept { return running_.load() == 0 && waiting_.empty(); }

private:
  // Admits the waiting calls the output now allows; pauses or resumes reading.
  void pump();
  bool admits() const noexcept;

  std::weak_ptr<net::connection> conn_;
  const net::connection* raw_;
  const std::size_t cap_;
  std::deque<start_fn> waiting_;             // (loop) arrived, not started
  bool pumping_ = false;                     // (loop) pump() runs: a nested call asks for another pass
  bool again_ = false;
  std::atomic<std::size_t> output_{0};       // the connection's unwritten output, as last seen on the loop
  std::atomic<std::size_t> in_transit_{0};   // replies encoded, not yet queued on the connection
  std::atomic<std::size_t> largest_{0};      // the largest reply so far
  std::atomic<std::size_t> running_{0};      // calls admitted, not finished
  std::atomic<bool> closed_{false};
};

} // namespace corodist::rpc::detail
