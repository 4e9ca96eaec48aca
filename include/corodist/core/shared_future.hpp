#pragma once
/// \file
/// corodist::shared_future<T>: one result, any number of consumers.

#include <corodist/core/config.hpp>

#include <corodist/core/future.hpp>

namespace corodist {

/// A result that many consumers read: copies share one state, and each
/// `get()` / `async_get()` sees the same value (returned by reference, or
/// copied to an awaiting coroutine). Made from `future<T>::share()`. Thread-safe
/// like future<T>: blocking calls throw `usage_error` on an event-loop thread
/// while the value is not ready.
template <typename T>
class shared_future {
public:
  /// An invalid shared_future.
  shared_future() = default;

  /// True if it refers to a shared state.
  bool valid() const noexcept { return state_ != nullptr; }

  /// True once a value or exception is stored. Never blocks.
  bool is_ready() const { return state_ && state_->ready(); }

  /// Blocks until ready; returns the value (a reference valid while any copy
  /// of this shared_future lives) or rethrows the exception.
  decltype(auto) get() const {
    wait();
    if constexpr (std::is_void_v<T>)
      state_->peek();
    else
      return static_cast<const T&>(state_->peek());
  }

  /// Blocks until ready. Throws `usage_error` on an event-loop thread if not ready.
  void wait() const {
    check_valid();
    if (!state_->ready()) {
      if (detail::on_loop_thread())
        detail::throw_blocking_on_loop("shared_future::wait()/get()");
      state_->wait();
    }
  }

  /// Blocks up to `d`; returns true if ready.
  template <typename Rep, typename Period>
  bool wait_for(std::chrono::duration<Rep, Period> d) const {
    check_valid();
    if (state_->ready())
      return true;
    if (detail::on_loop_thread())
      detail::throw_blocking_on_loop("shared_future::wait_for()");
    return state_->wait_until(std::chrono::steady_clock::now() + d);
  }

  /// Asynchronously reads the result: completes with `(exception_ptr, T)` (a
  /// copy of the value; for void `(exception_ptr)`) on the token's associated
  /// executor.
  /// Cancellation: terminal, partial and total through the token's slot: this
  /// wait completes with an `operation_aborted` system_error; other waiters
  /// and the shared result are untouched.
  template <typename CompletionToken = asio::use_awaitable_t<>>
  auto async_get(CompletionToken&& token = {}) const {
    check_valid();
    return asio::async_initiate<CompletionToken, typename detail::get_signature<T>::type>(
        [](auto handler, std::shared_ptr<detail::future_state<T>> st) {
          using handler_t = decltype(handler);
          detail::complete_when_ready<T>(
              st, std::move(handler),
              [](detail::future_state<T>& s, handler_t&& h) {
                if (auto e = s.exception()) {
                  if constexpr (std::is_void_v<T>)
                    std::move(h)(e);
                  else
                    std::move(h)(e, T{});
                  return;
                }
                if constexpr (std::is_void_v<T>)
                  std::move(h)(std::exception_ptr());
                else
                  std::move(h)(std::exception_ptr(), T(s.peek()));
              },
              [](handler_t&& h) {
                if constexpr (std::is_void_v<T>)
                  std::move(h)(detail::cancelled_wait());
                else
                  std::move(h)(detail::cancelled_wait(), T{});
              });
        },
        token, state_);
  }

  /// Asynchronously waits for readiness: completes with an error_code on the
  /// token's associated executor.
  /// Cancellation: terminal, partial and total through the token's slot:
  /// completes with `operation_aborted`; other waiters are untouched.
  template <typename CompletionToken = asio::use_awaitable_t<>>
  auto async_wait(CompletionToken&& token = {}) const {
    check_valid();
    return asio::async_initiate<CompletionToken, void(std::error_code)>(
        [](auto handler, std::shared_ptr<detail::future_state<T>> st) {
          using handler_t = decltype(handler);
          detail::complete_when_ready<T>(
              st, std::move(handler), [](detail::future_state<T>&, handler_t&& h) { std::move(h)(std::error_code()); },
              [](handler_t&& h) { std::move(h)(std::error_code(asio::error::operation_aborted)); });
        },
        token, state_);
  }

private:
  friend class future<T>;
  explicit shared_future(std::shared_ptr<detail::future_state<T>> st) noexcept : state_(std::move(st)) {}

  void check_valid() const {
    if (!state_)
      throw usage_error("corodist::shared_future: no state (default-constructed)");
  }

  std::shared_ptr<detail::future_state<T>> state_;
};

} // namespace corodist
