#pragma once
// The executor a coroutine function runs on (private): the loop's, making
// the call it serves the thread's current call (call_state.hpp) around each
// of its resumptions, so that calls it makes find the served call's deadline
// while many coroutine functions interleave on one loop. Everything the
// coroutine starts with its own executor (timers, sub-coroutines, co_spawn of
// `co_await this_coro::executor`, awaitable operators) resumes through it.

#include <corodist/rpc/detail/call_state.hpp>

#include <asio/execution.hpp>
#include <asio/prefer.hpp>
#include <asio/query.hpp>
#include <asio/require.hpp>

#include <memory>
#include <type_traits>
#include <utility>

namespace corodist::rpc::detail {

template <typename Inner>
class call_executor {
public:
  call_executor(Inner inner, std::shared_ptr<const call_state> state) noexcept
      : inner_(std::move(inner)), state_(std::move(state)) {}

  /// Runs `f` on the inner executor with the served call current.
  template <typename F>
  void execute(F&& f) const {
    asio::execution::execute(inner_, [state = state_, f = std::forward<F>(f)]() mutable {
      current_call_scope scope(state.get());
      std::move(f)();
    });
  }

  template <typename P>
  auto query(const P& p) const -> decltype(asio::query(std::declval<const Inner&>(), p)) {
    return asio::query(inner_, p);
  }

  template <typename P>
  auto require(const P& p) const
      -> call_executor<std::decay_t<decltype(asio::require(std::declval<const Inner&>(), p))>> {
    return {asio::require(inner_, p), state_};
  }

  template <typename P>
  auto prefer(const P& p) const
      -> call_executor<std::decay_t<decltype(asio::prefer(std::declval<const Inner&>(), p))>> {
    return {asio::prefer(inner_, p), state_};
  }

  /// Outstanding work is not counted (a preference, ignored): the loop runs
  /// until it is stopped, and the count's atomics would cost every
  /// operation of a coroutine function.
  call_executor prefer(const asio::execution::outstanding_work_t::tracked_t&) const noexcept { return *this; }

  friend bool operator==(const call_executor& a, const call_executor& b) noexcept {
    return a.inner_ == b.inner_ && a.state_ == b.state_;
  }
  friend bool operator!=(const call_executor& a, const call_executor& b) noexcept { return !(a == b); }

private:
  Inner inner_;
  std::shared_ptr<const call_state> state_;
};

} // namespace corodist::rpc::detail
