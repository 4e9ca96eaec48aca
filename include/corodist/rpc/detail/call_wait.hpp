#pragma once
/// \file
/// What `agent::call` awaits (private): one call's outcome, set once by its
/// reply, and the awaiting coroutine resumed on its own executor, without
/// the shared state, locks and continuation list of a corodist::future.

#include <corodist/core/config.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/unique_function.hpp>
#include <corodist/rpc/errors.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/dispatch.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/use_awaitable.hpp>

#include <atomic>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace corodist::rpc::detail {

/// One awaited call. The reply side (any thread, once) calls set_value or
/// set_exception; the awaiting side co_awaits wait(). Whichever of the
/// outcome and the awaiting coroutine's cancellation comes first ends the
/// wait; at a cancellation before the outcome, `on_cancel` runs once (it
/// tells the callee) and the wait throws rpc::cancelled_error.
template <typename R>
class call_wait : public std::enable_shared_from_this<call_wait<R>> {
public:
  using value_type = std::conditional_t<std::is_void_v<R>, std::monostate, R>;

  /// The function called, for errors.
  std::string fn;

  /// Stores the value and ends the wait (once): the waiter resumes inside
  /// this call if it runs on this thread's event loop (the reply's handler),
  /// else from its executor's queue.
  template <typename... V>
  void set_value(V&&... v) {
    value_.emplace(std::forward<V>(v)...);
    arrive(true);
  }
  /// Stores the error and ends the wait (once), as set_value. `at_once`:
  /// false: the waiter resumes from its executor's queue.
  void set_exception(std::exception_ptr e, bool at_once = true) {
    error_ = std::move(e);
    arrive(at_once);
  }
  /// True once an outcome was set.
  bool has_outcome() const noexcept { return (state_.load(std::memory_order_acquire) & has_result) != 0; }

  /// Returns the value, or throws the error, or at the awaiting coroutine's
  /// cancellation (terminal, partial or total, before the outcome) runs
  /// `on_cancel` and throws rpc::cancelled_error. Resumes on the coroutine's
  /// executor.
  static asio::awaitable<R> wait(std::shared_ptr<call_wait> self, unique_function<void()> on_cancel) {
    co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(std::exception_ptr)>(
        [&self, &on_cancel](auto handler) { self->start(std::move(handler), std::move(on_cancel)); },
        asio::use_awaitable);
    if constexpr (!std::is_void_v<R>)
      co_return std::move(*self->value_);
  }

private:
  static constexpr unsigned has_result = 1, has_waiter = 2, was_cancelled = 4;

  template <typename Handler>
  void start(Handler&& h, unique_function<void()> on_cancel) {
    auto slot = asio::get_associated_cancellation_slot(h);
    work_ = asio::prefer(asio::get_associated_executor(h), asio::execution::outstanding_work.tracked);
    resume_ = [h = std::move(h)](std::exception_ptr e) mutable { std::move(h)(std::move(e)); };
    slot_ = slot;
    if (slot.is_connected())
      slot.assign([self = this->shared_from_this(), on_cancel = std::move(on_cancel)](asio::cancellation_type) mutable {
        const auto prev = self->state_.fetch_or(was_cancelled, std::memory_order_acq_rel);
        if (prev & (was_cancelled | has_result))
          return; // (the outcome is on its way, or this was the second emit)
        if (on_cancel)
          on_cancel();
        if (prev & has_waiter)
          self->finish(cancelled(), false);
      });
    const auto prev = state_.fetch_or(has_waiter, std::memory_order_acq_rel);
    if (prev & was_cancelled)
      finish(cancelled(), false);
    else if (prev & has_result)
      finish(error_, false);
  }

  static std::exception_ptr cancelled() { return std::make_exception_ptr(cancelled_error("rpc call")); }

  void arrive(bool at_once) {
    const auto prev = state_.fetch_or(has_result, std::memory_order_acq_rel);
    if ((prev & has_waiter) && !(prev & was_cancelled))
      finish(error_, at_once);
  }

  // Resumes the waiter on its executor, once (`at_once`: inside this call
  // when that is this thread's), its slot cleared first (the slot's handler
  // holds this).
  void finish(std::exception_ptr e, bool at_once) {
    auto ex = std::move(work_);
    auto resume = [self = this->shared_from_this(), e = std::move(e)]() mutable {
      if (self->slot_.is_connected())
        self->slot_.clear();
      auto r = std::move(self->resume_);
      r(std::move(e));
    };
    if (at_once)
      asio::dispatch(ex, std::move(resume));
    else
      asio::post(ex, std::move(resume));
  }

  std::atomic<unsigned> state_{0};
  std::optional<value_type> value_;
  std::exception_ptr error_;
  unique_function<void(std::exception_ptr)> resume_;
  asio::any_io_executor work_;
  asio::cancellation_slot slot_;
};

/// The reply side's hold on a call_wait: an outcome never set (the agent
/// went away with the call) ends the wait with a broken-promise error, as a
/// corodist::promise does.
template <typename R>
class call_wait_setter {
public:
  explicit call_wait_setter(std::shared_ptr<call_wait<R>> w) noexcept : wait_(std::move(w)) {}
  call_wait_setter(call_wait_setter&&) noexcept = default;
  call_wait_setter& operator=(call_wait_setter&&) = delete;
  ~call_wait_setter() {
    if (wait_ && !wait_->has_outcome()) // (not at once: this may run inside any teardown)
      wait_->set_exception(std::make_exception_ptr(error("corodist: a call ended without a reply (broken promise)")),
                           false);
  }
  /// The function called.
  const std::string& fn() const noexcept { return wait_->fn; }
  template <typename... V>
  void set_value(V&&... v) {
    wait_->set_value(std::forward<V>(v)...);
  }
  void set_exception(std::exception_ptr e) { wait_->set_exception(std::move(e)); }

private:
  std::shared_ptr<call_wait<R>> wait_;
};

} // namespace corodist::rpc::detail
