#pragma once
/// \file
/// The state a promise shares with its future or shared_future, and the Asio
/// initiations that await it (private to core/; included by future.hpp).

#include <corodist/core/config.hpp>

#include <corodist/core/unique_function.hpp>
#include <corodist/core/error.hpp>

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/error.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/system_error.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace corodist::detail {

bool on_loop_thread() noexcept; // defined in event_loop.cpp

[[noreturn]] void throw_blocking_on_loop(const char* what);

/// A value, or an exception, set once; waited for by threads (a condition
/// variable) and by continuations (run by the thread that sets it). Thread-safe.
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

  /// The value, left in place (rethrows a stored exception). Precondition: ready.
  const stored_type& peek() const {
    std::lock_guard lk(mutex_);
    if (error_)
      std::rethrow_exception(error_);
    return *value_;
  }

  /// The stored exception, if any. Precondition: ready.
  std::exception_ptr exception() const {
    std::lock_guard lk(mutex_);
    return error_;
  }

  /// Registers a continuation, run once when ready: at once (on this thread)
  /// if already ready, else on the thread that completes the promise. Returns
  /// an id for drop_continuation (0 when it ran at once).
  std::uint64_t on_ready(unique_function<void()> f) {
    std::unique_lock lk(mutex_);
    if (ready_) {
      lk.unlock();
      f();
      return 0;
    }
    const auto id = ++last_id_;
    continuations_.push_back({id, std::move(f)});
    return id;
  }

  /// Sets what cancel() runs while the state is not ready (replacing an
  /// earlier one); dropped once ready.
  void set_canceller(unique_function<void()> c) {
    std::unique_lock lk(mutex_);
    if (ready_)
      return;
    std::swap(canceller_, c);
    lk.unlock(); // (the old one is destroyed outside the lock)
  }

  /// Runs the canceller once, if one is set and the state is not ready;
  /// outside the lock (it may complete the state).
  void cancel() {
    unique_function<void()> c;
    {
      std::lock_guard lk(mutex_);
      if (ready_)
        return;
      c = std::move(canceller_);
      canceller_ = {};
    }
    if (c)
      c();
  }

  /// Drops a registered, not yet run continuation (cancellation).
  void drop_continuation(std::uint64_t id) {
    unique_function<void()> dropped;
    std::lock_guard lk(mutex_);
    for (auto it = continuations_.begin(); it != continuations_.end(); ++it)
      if (it->first == id) {
        dropped = std::move(it->second);
        continuations_.erase(it);
        return;
      }
  }

private:
  void check_unset() {
    if (ready_)
      throw usage_error("corodist::promise: value already set");
  }

  void finish(std::unique_lock<std::mutex>& lk) {
    ready_ = true;
    auto conts = std::move(continuations_);
    continuations_.clear();
    auto canceller = std::move(canceller_); // no longer needed: destroyed outside the lock
    canceller_ = {};
    lk.unlock();
    cv_.notify_all();
    for (auto& [id, c] : conts)
      c();
  }

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool ready_ = false;
  std::optional<stored_type> value_;
  std::exception_ptr error_;
  std::uint64_t last_id_ = 0;
  std::vector<std::pair<std::uint64_t, unique_function<void()>>> continuations_;
  unique_function<void()> canceller_; // the producer's, if it can be cancelled
};

/// Completes an Asio handler once the state is ready (or at cancellation
/// through the handler's slot), on the handler's associated executor. `deliver`
/// turns the ready state into the handler's arguments.
template <typename T, typename Handler, typename Deliver>
void complete_when_ready(std::shared_ptr<future_state<T>> st, Handler&& handler, Deliver deliver,
                         unique_function<void(std::decay_t<Handler>&&)> on_cancel) {
  using handler_t = std::decay_t<Handler>;
  auto ex = asio::get_associated_executor(handler);
  auto slot = asio::get_associated_cancellation_slot(handler);
  using work_t = std::decay_t<decltype(asio::prefer(ex, asio::execution::outstanding_work.tracked))>;
  struct op {
    op(handler_t&& h, work_t w, Deliver d, unique_function<void(handler_t&&)> c)
        : handler(std::move(h)), work(std::move(w)), deliver(std::move(d)), cancelled(std::move(c)) {}
    handler_t handler;
    work_t work;
    Deliver deliver;
    unique_function<void(handler_t&&)> cancelled;
    std::atomic<bool> done{false};
    std::uint64_t id = 0;
  };
  auto o = std::make_shared<op>(std::forward<Handler>(handler), asio::prefer(ex, asio::execution::outstanding_work.tracked),
                                std::move(deliver), std::move(on_cancel));
  auto complete = [o, slot, st](bool aborted) mutable {
    if (o->done.exchange(true))
      return;
    auto w = std::move(o->work);
    asio::post(w, [o, slot, st, aborted]() mutable {
      if (slot.is_connected())
        slot.clear();
      if (aborted)
        o->cancelled(std::move(o->handler));
      else
        o->deliver(*st, std::move(o->handler));
    });
  };
  if (slot.is_connected()) {
    slot.assign([st, o, complete](asio::cancellation_type) mutable {
      st->drop_continuation(o->id);
      complete(true);
    });
  }
  o->id = st->on_ready([complete]() mutable { complete(false); });
}

/// The exception an awaiter whose wait was cancelled gets.
inline std::exception_ptr cancelled_wait() {
  return std::make_exception_ptr(asio::system_error(asio::error::operation_aborted, "corodist::future wait"));
}

} // namespace corodist::detail
