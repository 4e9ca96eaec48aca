#pragma once
/// \file
/// corodist::store::watch_stream: the events of one watched key.

#include <corodist/core/config.hpp>

#include <corodist/core/unique_function.hpp>
#include <corodist/core/timeout.hpp>
#include <corodist/store/default_timeout.hpp>
#include <corodist/store/watch_event.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <deque>
#include <exception>
#include <memory>

namespace corodist::store {

class prefix_store;

namespace detail {
/// The queue behind a watch_stream; lives on the store's executor.
struct watch_queue {
  explicit watch_queue(asio::any_io_executor ex) : executor(std::move(ex)) {}
  /// Delivers an event (on the store's executor).
  void push(watch_event e);
  /// Ends the stream: a pending and every later `next()` throws `error`.
  void fail(std::exception_ptr error);

  asio::any_io_executor executor;
  std::deque<watch_event> events;
  std::exception_ptr failure;
  corodist::unique_function<void()> wake;  // set while next() waits
  corodist::unique_function<void()> on_close; // unregisters at the source
  std::size_t key_strip = 0; // leading key bytes to drop (a prefix_store's prefix)
  bool closed = false;
};
} // namespace detail

/// A stream of `watch_event`s for one key, from `store::watch_key`. Events
/// arrive in the order the store applied the changes. Move-only; destroying
/// or `close()`-ing it unsubscribes.
class watch_stream {
public:
  watch_stream() = default;
  explicit watch_stream(std::shared_ptr<detail::watch_queue> q) : q_(std::move(q)) {}
  watch_stream(watch_stream&&) noexcept = default;
  watch_stream& operator=(watch_stream&& other) noexcept {
    if (this != &other) {
      close();
      q_ = std::move(other.q_);
    }
    return *this;
  }
  ~watch_stream() { close(); }

  /// Returns the next event, waiting for it within `limit` (`inherit()`:
  /// `default_timeout`). Throws `timeout_error`, or `connection_error` if the
  /// store's connection was lost. Call from one coroutine at a time.
  /// Cancellation: terminal, partial and total through the awaiting
  /// coroutine's cancellation slot (`operation_aborted`); no event is lost:
  /// one that arrives later is returned by the next call.
  [[nodiscard]] asio::awaitable<watch_event> next(corodist::timeout limit = corodist::timeout::inherit());

  /// Unsubscribes; events already queued are dropped. Idempotent, thread-safe.
  void close() noexcept;

  /// Events received and not yet taken (loop thread only).
  std::size_t queued() const noexcept { return q_ ? q_->events.size() : 0; }

private:
  friend class prefix_store;
  std::shared_ptr<detail::watch_queue> q_;
};

} // namespace corodist::store
