#pragma once
/// \file
/// corodist::rpc::stream_reader: the reading end of an RPC stream (a client
/// of a server stream, a bidirectional handler's input).

#include <corodist/core/config.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/rpc/detail/stream_core.hpp>
#include <corodist/rpc/stream_stats.hpp>

#include <asio/awaitable.hpp>

#include <memory>
#include <optional>
#include <utility>

namespace corodist::rpc {

/// Reads the items of type T a stream's other end writes, in order, then its
/// end (nullopt) or its error. Taking an item gives its credit back to the
/// writer. Dropping a reader before the end cancels the stream.
///
/// next() is loop-affine (await it on the agent's loop); next_sync() is for
/// plain threads; cancel() from any thread. Move-only.
template <typename T>
class stream_reader {
public:
  stream_reader() = default;
  /// (`owning`: this reader cancels the stream when dropped before its end.)
  explicit stream_reader(std::shared_ptr<detail::stream_core> core, bool owning = true)
      : core_(std::move(core)), owning_(owning) {}
  stream_reader(stream_reader&& o) noexcept : core_(std::move(o.core_)), owning_(o.owning_) { o.core_.reset(); }
  stream_reader& operator=(stream_reader&& o) noexcept {
    if (this != &o) {
      drop();
      core_ = std::move(o.core_);
      owning_ = o.owning_;
      o.core_.reset();
    }
    return *this;
  }
  ~stream_reader() { drop(); }

  /// The next item, or nullopt at the end of the stream. Throws, after the
  /// items that came before it: remote_error (the remote handler threw; its
  /// subclasses for an unknown stream function or bad arguments),
  /// bad_result_error (an item does not decode to T), and at once:
  /// cancelled_error (cancelled at either end), timeout_error (the stream's
  /// deadline passed), peer_lost_error / connection_error (the peer or the
  /// connection is gone), usage_error (off the agent's loop).
  /// Cancellation: terminal, partial and total through the awaiting
  /// coroutine's cancellation slot: the wait ends with `operation_aborted`;
  /// no item is taken and the stream stays usable.
  [[nodiscard]] asio::awaitable<std::optional<T>> next() {
    core_->require_loop("stream_reader::next");
    auto& in = static_cast<detail::typed_inbox<T>&>(*core_->inbox());
    while (in.items.empty()) {
      const bool more = co_await core_->wait_readable();
      if (!more)
        co_return std::nullopt;
    }
    std::optional<T> v(std::move(in.items.front().value));
    const auto bytes = in.items.front().bytes;
    in.items.pop_front();
    core_->consumed(bytes);
    co_return v;
  }

  /// next() for plain threads: blocks until an item, the end or an error.
  /// Throws as next(), and usage_error on an event-loop thread.
  std::optional<T> next_sync() {
    return run_blocking(core_->executor(), next(), "rpc::stream_reader::next_sync (use next() in coroutines)");
  }

  /// Cancels the stream: the writer's next write throws cancelled_error (a
  /// server's handler is cancelled: its pending operation ends with
  /// `operation_aborted`); this reader's next read throws cancelled_error.
  /// Any thread; a no-op once the stream ended.
  void cancel() {
    if (core_)
      core_->cancel();
  }

  /// This end's counters. Loop only.
  stream_stats stats() const noexcept { return core_->stats(); }

private:
  void drop() noexcept {
    if (core_ && owning_)
      core_->cancel();
    core_.reset();
  }
  std::shared_ptr<detail::stream_core> core_;
  bool owning_ = true;
};

} // namespace corodist::rpc
