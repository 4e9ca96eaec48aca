#pragma once
// Test helpers: run a coroutine to completion on a fresh io_context with a
// deadline, failing the test (not hanging) if it does not finish.

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <exception>
#include <optional>
#include <string>

namespace corodist::test {

/// Runs `make(ctx)`'s awaitable on a fresh io_context in this thread; fails
/// the test if it has not finished after `timeout`. Returns its value.
template <typename T>
T run_coro(asio::io_context& ctx, asio::awaitable<T> a, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  bool done = false;
  std::exception_ptr ex;
  std::optional<std::conditional_t<std::is_void_v<T>, int, T>> result;
  if constexpr (std::is_void_v<T>) {
    asio::co_spawn(ctx, std::move(a), [&](std::exception_ptr e) { ex = e; done = true; });
  } else {
    asio::co_spawn(ctx, std::move(a), [&](std::exception_ptr e, T v) {
      ex = e;
      if (!e)
        result.emplace(std::move(v));
      done = true;
    });
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    ctx.restart();
    ctx.run_for(std::chrono::milliseconds(50));
  }
  if (!done)
    BOOST_FAIL("coroutine did not finish within " + std::to_string(timeout.count()) + " ms");
  if (ex)
    std::rethrow_exception(ex);
  if constexpr (!std::is_void_v<T>)
    return std::move(*result);
}

/// Runs what is left on `ctx` (at most `limit`), above all the handlers of
/// operations that a close aborted: they must run before the context is
/// destroyed, since Asio 1.22's io_uring backend destroys a pending accept's
/// socket service before the accept (a use after free under ASan). Call it
/// after closing a listener or server made on a raw io_context.
inline void settle(asio::io_context& ctx, std::chrono::milliseconds limit = std::chrono::seconds(2)) {
  ctx.restart();
  ctx.run_for(limit);
}

} // namespace corodist::test
