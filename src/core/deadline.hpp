#pragma once
/// \file
/// The private code's one "operation or deadline" race, and its error-code completion token.

#include <asio/awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <optional>
#include <utility>
#include <variant>

namespace corodist::detail {

/// Completion token that yields `(error_code, results...)` tuples instead of throwing.
inline constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);

/// Awaits `op` for at most `timeout` (zero or less: the deadline has already passed).
/// Returns op's result, or std::nullopt when the deadline came first; `op` is then
/// cancelled (its Asio operation ends with operation_aborted, and that result is dropped).
/// Runs on the awaiting coroutine's executor; T must not be void.
template <typename T>
[[nodiscard]] asio::awaitable<std::optional<T>> within(asio::awaitable<T> op,
                                                       std::chrono::steady_clock::duration timeout) {
  using namespace asio::experimental::awaitable_operators;
  asio::steady_timer timer(co_await asio::this_coro::executor, timeout);
  auto r = co_await (std::move(op) || timer.async_wait(use_tuple));
  if (r.index() == 1)
    co_return std::nullopt;
  co_return std::optional<T>(std::move(std::get<0>(r)));
}

} // namespace corodist::detail
