#pragma once
/// \file
/// The private code's one "operation or deadline" race, and its error-code completion token.

#include <corodist/core/timeout.hpp>

#include <asio/awaitable.hpp>
#include <asio/cancellation_state.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/error.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <utility>
#include <system_error>
#include <variant>

namespace corodist::detail {

/// Completion token that yields `(error_code, results...)` tuples instead of throwing.
inline constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);

/// Awaits `op` for at most `timeout` (zero or less: the deadline has already passed).
/// Returns op's result, or std::nullopt when the deadline came first; `op` is then
/// cancelled (its Asio operation ends with operation_aborted, and that result is dropped).
/// An exception `op` throws is rethrown at once. Runs on the awaiting coroutine's
/// executor; T must not be void.
template <typename T>
[[nodiscard]] asio::awaitable<std::optional<T>> within(asio::awaitable<T> op,
                                                       std::chrono::steady_clock::duration timeout) {
  using namespace asio::experimental::awaitable_operators;
  // Asio 1.22's || does not count a branch that throws as the one that finished
  // first: it waits for the timer and drops the exception. So the exception is
  // caught inside the branch and rethrown here.
  auto caught = [](asio::awaitable<T> o) -> asio::awaitable<std::pair<std::optional<T>, std::exception_ptr>> {
    try {
      co_return std::pair<std::optional<T>, std::exception_ptr>(co_await std::move(o), nullptr);
    } catch (...) {
      co_return std::pair<std::optional<T>, std::exception_ptr>(std::nullopt, std::current_exception());
    }
  };
  asio::steady_timer timer(co_await asio::this_coro::executor, timeout);
  auto r = co_await (caught(std::move(op)) || timer.async_wait(use_tuple));
  // Cancelled from outside: both branches were cancelled, and whichever ended
  // first (the timer, maybe) says nothing; the race ends as the cancellation.
  const asio::cancellation_state outer = co_await asio::this_coro::cancellation_state;
  if (outer.cancelled() != asio::cancellation_type::none)
    throw std::system_error(asio::error::operation_aborted, "operation cancelled");
  if (r.index() == 1)
    co_return std::nullopt;
  auto& [value, failure] = std::get<0>(r);
  if (failure)
    std::rethrow_exception(failure);
  co_return std::move(value);
}

/// As above, until `by` (no timer at all when `by` is never()).
template <typename T>
[[nodiscard]] asio::awaitable<std::optional<T>> within(asio::awaitable<T> op, corodist::deadline by) {
  if (by.is_never())
    co_return std::optional<T>(co_await std::move(op));
  co_return co_await within(std::move(op), by.remaining());
}

/// The private code's milliseconds for `t` (resolved: not inherit()): its
/// length (at least 1), or 0 — "none" — for never().
[[nodiscard]] inline std::chrono::milliseconds zero_is_none(corodist::timeout t) noexcept {
  return t.is_finite() ? std::max(t.length(), std::chrono::milliseconds(1)) : std::chrono::milliseconds(0);
}

} // namespace corodist::detail
