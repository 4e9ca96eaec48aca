#pragma once
/// \file
/// corodist::future<T> / corodist::promise<T>: a thread-safe one-shot result
/// for coroutines (`co_await f.async_get()`) and plain threads (`f.get()`).

#include <corodist/core/config.hpp>

#include <corodist/core/detail/future_state.hpp>
#include <corodist/core/unique_function.hpp>
#include <corodist/core/error.hpp>

#include <asio/async_result.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <exception>
#include <memory>
#include <type_traits>
#include <utility>

namespace corodist {

template <typename T>
class future;
template <typename T>
class promise;
template <typename T>
class shared_future;

namespace detail {

/// Access to a future's state for core/'s own combinators (when_all).
struct future_access {
  template <typename T>
  static const std::shared_ptr<future_state<T>>& state(const future<T>& f) noexcept {
    return f.state_;
  }
};

/// The result type of a then() continuation `F` on a future<T>.
template <typename F, typename T>
struct continuation_result {
  using type = std::invoke_result_t<F, T>;
};
template <typename F>
struct continuation_result<F, void> {
  using type = std::invoke_result_t<F>;
};

/// The completion signature of async_get: the exception, then the value.
template <typename T>
struct get_signature {
  using type = void(std::exception_ptr, T);
};
template <>
struct get_signature<void> {
  using type = void(std::exception_ptr);
};

} // namespace detail

/// The consumer side of a one-shot result. It has one consumer: `get()`,
/// `async_get()` and `then()` each take the value.
///
/// * In a coroutine: `T v = co_await f.async_get();` suspends without blocking
///   a thread and resumes on the awaiting coroutine's executor, rethrowing a
///   stored exception. `async_get(token)` takes any Asio completion token
///   (`asio::use_awaitable` by default; `asio::use_future`, a callback,
///   `as_tuple`). Cancelling the wait through the token's slot does not touch
///   the result. To race it against a timer, race `async_wait()` (which never
///   throws): Asio 1.22's `||` drops an exception thrown by a branch.
/// * From plain threads: `get()` / `wait()` / `wait_for()`. On an event-loop
///   thread they throw `usage_error` while the value is not ready, because
///   blocking there would deadlock the loop.
/// * `then(fn)`: a continuation returning a new future; `share()`: a
///   shared_future for many consumers.
///
/// A future allocates nothing beyond its shared state until it is awaited.
template <typename T>
class future {
public:
  /// An invalid future (`valid() == false`).
  future() = default;
  future(future&&) noexcept = default;
  future& operator=(future&&) noexcept = default;

  /// True if the future refers to a shared state.
  bool valid() const noexcept { return state_ != nullptr; }

  /// True once a value or exception is stored. Never blocks.
  bool is_ready() const { return state_ && state_->ready(); }

  /// Blocks until ready, then returns the value or rethrows the exception.
  /// Throws `usage_error` on an event-loop thread if not ready, or if the value
  /// was already taken.
  T get() {
    check_valid(); // (also here: GCC 12 does not see wait()'s check and warns of a null state below)
    wait();
    if constexpr (std::is_void_v<T>)
      state_->take();
    else
      return state_->take();
  }

  /// Blocks until ready. Throws `usage_error` on an event-loop thread if not ready.
  void wait() const {
    check_valid();
    if (!state_->ready()) {
      if (detail::on_loop_thread())
        detail::throw_blocking_on_loop("future::wait()/get()");
      state_->wait();
    }
  }

  /// Blocks up to `d`; returns true if ready. Throws `usage_error` on an
  /// event-loop thread if not ready.
  template <typename Rep, typename Period>
  bool wait_for(std::chrono::duration<Rep, Period> d) const {
    check_valid();
    if (state_->ready())
      return true;
    if (detail::on_loop_thread())
      detail::throw_blocking_on_loop("future::wait_for()");
    return state_->wait_until(std::chrono::steady_clock::now() + d);
  }

  /// Asynchronously takes the result: completes with `(exception_ptr, T)` (for
  /// void: `(exception_ptr)`) on the token's associated executor once ready.
  /// With `asio::use_awaitable` (the default) `co_await` returns the value or
  /// throws.
  /// Cancellation: terminal, partial and total through the token's slot: the
  /// wait completes with an `operation_aborted` system_error; the result is
  /// left in place (a later `get()` / `async_get()` takes it) and the
  /// producer is not told.
  template <typename CompletionToken = asio::use_awaitable_t<>>
  auto async_get(CompletionToken&& token = {}) {
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
                if constexpr (std::is_void_v<T>) {
                  s.take();
                  std::move(h)(std::exception_ptr());
                } else {
                  std::move(h)(std::exception_ptr(), s.take());
                }
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

  /// Asynchronously waits for readiness without taking the result: completes
  /// with an error_code on the token's associated executor. Then call get().
  /// Cancellation: terminal, partial and total through the token's slot:
  /// completes with `operation_aborted`; the result is left in place.
  template <typename CompletionToken = asio::use_awaitable_t<>>
  auto async_wait(CompletionToken&& token = {}) {
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

  /// Runs `fn(value)` (or `fn()` for void) once the value is ready, on the
  /// thread that completes the promise (or at once if ready), and returns a
  /// future of its result. An exception, stored or thrown by `fn`, is carried
  /// into the returned future without calling `fn`.
  template <typename F>
  auto then(F fn) {
    check_valid();
    using R = typename detail::continuation_result<F, T>::type;
    promise<R> p;
    future<R> next = p.get_future();
    auto st = state_;
    st->on_ready([st, p = std::move(p), fn = std::move(fn)]() mutable {
      try {
        if constexpr (std::is_void_v<T>) {
          st->take();
          if constexpr (std::is_void_v<R>) {
            fn();
            p.set_value();
          } else {
            p.set_value(fn());
          }
        } else {
          if constexpr (std::is_void_v<R>) {
            fn(st->take());
            p.set_value();
          } else {
            p.set_value(fn(st->take()));
          }
        }
      } catch (...) {
        p.set_exception(std::current_exception());
      }
    });
    return next;
  }

  /// Asks the producer to stop: runs the canceller the producer set with
  /// `promise::set_canceller` (an RPC's sends a cancel to the callee, and the
  /// future then completes with `rpc::cancelled_error`), once, on this
  /// thread. Does nothing when the producer set none, once the result is
  /// ready, or on a second call. Never blocks; any thread. Whether and when
  /// the future completes is the producer's (it may still deliver a value
  /// that was already on its way).
  void cancel() {
    if (state_)
      state_->cancel();
  }

  /// Turns this future into a shared_future (this one becomes invalid).
  shared_future<T> share() noexcept { return shared_future<T>(std::move(state_)); }

private:
  friend class promise<T>;
  friend struct detail::future_access;
  explicit future(std::shared_ptr<detail::future_state<T>> st) : state_(std::move(st)) {}

  void check_valid() const {
    if (!state_)
      throw usage_error("corodist::future: no state (default-constructed or moved-from)");
  }

  std::shared_ptr<detail::future_state<T>> state_;
};

/// The producer side. Thread-safe: set the value from any thread. Destroying a
/// promise without setting it stores a `corodist::error` ("broken promise").
template <typename T>
class promise {
public:
  promise() : state_(std::make_shared<detail::future_state<T>>()) {}
  promise(promise&&) noexcept = default;
  promise& operator=(promise&& other) noexcept {
    abandon();
    state_ = std::move(other.state_);
    retrieved_ = other.retrieved_;
    return *this;
  }
  ~promise() { abandon(); }

  /// Returns the future; throws `usage_error` if called twice.
  future<T> get_future() {
    if (retrieved_)
      throw usage_error("corodist::promise: get_future() called twice");
    retrieved_ = true;
    return future<T>(state_);
  }

  /// Stores the value and wakes the consumers. Throws `usage_error` if already set.
  template <typename... A>
  void set_value(A&&... a) {
    state_->set_value(std::forward<A>(a)...);
  }

  /// Stores an exception for the consumers to rethrow.
  void set_exception(std::exception_ptr e) { state_->set_exception(std::move(e)); }

  /// Sets what the future's `cancel()` runs (at most once, on the thread that
  /// calls it, while no result is stored); a later call replaces it. It
  /// should make the producer complete this promise soon (e.g. with an
  /// error); it is dropped once a result is stored.
  void set_canceller(unique_function<void()> c) { state_->set_canceller(std::move(c)); }

  /// True once a value or exception has been stored.
  bool is_set() const { return state_ && state_->ready(); }

private:
  void abandon() noexcept {
    if (state_ && !state_->ready()) {
      try {
        state_->set_exception(
            std::make_exception_ptr(error("corodist::promise destroyed without a value (broken promise)")));
      } catch (...) {
      }
    }
  }

  std::shared_ptr<detail::future_state<T>> state_;
  bool retrieved_ = false;
};

/// Returns a future that is already ready with `v`.
template <typename T>
future<std::decay_t<T>> make_ready_future(T&& v) {
  promise<std::decay_t<T>> p;
  p.set_value(std::forward<T>(v));
  return p.get_future();
}

/// Returns a ready `future<void>`.
inline future<void> make_ready_future() {
  promise<void> p;
  p.set_value();
  return p.get_future();
}

/// Returns a future that rethrows `e`.
template <typename T>
future<T> make_exceptional_future(std::exception_ptr e) {
  promise<T> p;
  p.set_exception(std::move(e));
  return p.get_future();
}

} // namespace corodist

#include <corodist/core/shared_future.hpp>
