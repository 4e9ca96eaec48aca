#pragma once
/// \file
/// corodist::future<T> / corodist::promise<T>: a thread-safe one-shot result
/// that works both in coroutines (`co_await std::move(f)`) and in plain
/// threads (`f.get()`).

#include <corodist/core/detail/unique_function.hpp>
#include <corodist/core/error.hpp>

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/error.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/use_awaitable.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>

namespace corodist {

template <typename T>
class future;
template <typename T>
class promise;

namespace detail {

bool on_loop_thread() noexcept; // defined in event_loop.cpp

[[noreturn]] void throw_blocking_on_loop(const char* what);

/// The state a promise and its future share. Thread-safe.
template <typename T>
class future_state {
public:
  using stored_type = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

  template <typename... A>
  void set_value(A&&... a) {
    std::unique_lock lk(mutex_);
    check_unset();
    value_.emplace(std::forward<A>(a)...);
    finish(lk);
  }

  void set_exception(std::exception_ptr e) {
    std::unique_lock lk(mutex_);
    check_unset();
    error_ = std::move(e);
    finish(lk);
  }

  bool ready() const {
    std::lock_guard lk(mutex_);
    return ready_;
  }

  void wait() {
    std::unique_lock lk(mutex_);
    cv_.wait(lk, [&] { return ready_; });
  }

  template <typename Clock, typename Duration>
  bool wait_until(const std::chrono::time_point<Clock, Duration>& tp) {
    std::unique_lock lk(mutex_);
    return cv_.wait_until(lk, tp, [&] { return ready_; });
  }

  /// Moves the value out (rethrows a stored exception). Precondition: ready.
  stored_type take() {
    std::lock_guard lk(mutex_);
    if (error_)
      std::rethrow_exception(error_);
    if (!value_)
      throw usage_error("corodist::future: the value was already retrieved");
    stored_type v = std::move(*value_);
    value_.reset();
    return v;
  }

  /// Registers the single continuation, run once when ready: at once (on this
  /// thread) if already ready, else on the thread that completes the promise.
  void on_ready(unique_function<void()> f) {
    std::unique_lock lk(mutex_);
    if (continuation_ || continuation_taken_)
      throw usage_error("corodist::future: already awaited or continued (one consumer only)");
    if (ready_) {
      continuation_taken_ = true;
      lk.unlock();
      f();
      return;
    }
    continuation_ = std::move(f);
  }

  /// Drops a registered, not yet run continuation (cancellation).
  void drop_continuation() {
    unique_function<void()> dropped;
    std::lock_guard lk(mutex_);
    if (!ready_) {
      dropped = std::move(continuation_);
      continuation_ = {};
    }
  }

private:
  void check_unset() {
    if (ready_)
      throw usage_error("corodist::promise: value already set");
  }

  void finish(std::unique_lock<std::mutex>& lk) {
    ready_ = true;
    auto cont = std::move(continuation_);
    continuation_ = {};
    if (cont)
      continuation_taken_ = true;
    lk.unlock();
    cv_.notify_all();
    if (cont)
      cont();
  }

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool ready_ = false;
  bool continuation_taken_ = false;
  std::optional<stored_type> value_;
  std::exception_ptr error_;
  unique_function<void()> continuation_;
};

/// Asio initiation for future::async_wait: completes with an error_code
/// (operation_aborted on cancellation) on the handler's associated executor.
template <typename T>
struct initiate_future_wait {
  template <typename Handler>
  void operator()(Handler&& handler, std::shared_ptr<future_state<T>> st) const {
    using handler_t = std::decay_t<Handler>;
    auto ex = asio::get_associated_executor(handler);
    auto slot = asio::get_associated_cancellation_slot(handler);
    using work_t = std::decay_t<decltype(asio::prefer(ex, asio::execution::outstanding_work.tracked))>;
    struct op {
      op(handler_t&& h, work_t w) : handler(std::move(h)), work(std::move(w)) {}
      handler_t handler;
      work_t work;
      std::atomic<bool> done{false};
    };
    auto o = std::make_shared<op>(std::forward<Handler>(handler),
                                  asio::prefer(ex, asio::execution::outstanding_work.tracked));
    auto complete = [o, slot](std::error_code ec) mutable {
      if (o->done.exchange(true))
        return;
      auto w = std::move(o->work);
      asio::post(w, [o, ec, slot]() mutable {
        if (slot.is_connected())
          slot.clear();
        std::move(o->handler)(ec);
      });
    };
    if (slot.is_connected()) {
      slot.assign([st, complete](asio::cancellation_type) mutable {
        st->drop_continuation();
        complete(asio::error::operation_aborted);
      });
    }
    st->on_ready([complete]() mutable { complete({}); });
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

template <typename T>
asio::awaitable<T> await_future(std::shared_ptr<future_state<T>> st) {
  if (!st)
    throw usage_error("corodist::future: awaiting an invalid future");
  if (!st->ready())
    co_await asio::async_initiate<decltype(asio::use_awaitable), void(std::error_code)>(
        initiate_future_wait<T>{}, asio::use_awaitable, st);
  if constexpr (std::is_void_v<T>)
    st->take();
  else
    co_return st->take();
}

} // namespace detail

/// The consumer side of a one-shot result.
///
/// * `co_await std::move(f)` in an `asio::awaitable` coroutine on any
///   executor: suspends without blocking a thread and resumes on that
///   coroutine's executor; rethrows the stored exception. The future *is* an
///   `asio::awaitable<T>`, so it composes with Asio's awaitable operators
///   (`co_await (std::move(f) || timer.async_wait(use_awaitable))`).
/// * `get()` / `wait()` / `wait_for()` from plain threads. On an event-loop
///   thread they throw `usage_error` while the value is not ready, because
///   blocking there would deadlock the loop.
/// * `then(fn)`: a continuation returning a new future.
///
/// A future has one consumer: awaiting, `then` and `get` each take the value.
template <typename T>
class future : public asio::awaitable<T> {
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

  /// Asio asynchronous wait for readiness with any completion token; the
  /// handler gets an error_code (operation_aborted if cancelled through its
  /// cancellation slot) and runs on its associated executor. Then call get().
  template <typename CompletionToken>
  auto async_wait(CompletionToken&& token) {
    check_valid();
    return asio::async_initiate<CompletionToken, void(std::error_code)>(
        detail::initiate_future_wait<T>{}, token, state_);
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

private:
  friend class promise<T>;
  explicit future(std::shared_ptr<detail::future_state<T>> st)
      : asio::awaitable<T>(detail::await_future<T>(st)), state_(std::move(st)) {}

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

  /// Stores the value and wakes the consumer. Throws `usage_error` if already set.
  template <typename... A>
  void set_value(A&&... a) {
    state_->set_value(std::forward<A>(a)...);
  }

  /// Stores an exception for the consumer to rethrow.
  void set_exception(std::exception_ptr e) { state_->set_exception(std::move(e)); }

private:
  void abandon() noexcept {
    if (state_ && !state_->ready()) {
      try {
        state_->set_exception(std::make_exception_ptr(error("corodist::promise destroyed without a value (broken promise)")));
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
