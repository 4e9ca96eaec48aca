#pragma once
/// \file
/// corodist::run_blocking: run a coroutine on an executor and block the
/// calling (plain) thread for its result — the one implementation behind every
/// blocking facade.

#include <corodist/core/config.hpp>

#include <corodist/core/error.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/execution/context.hpp>
#include <asio/execution_context.hpp>
#include <asio/query.hpp>

#include <exception>
#include <future>
#include <string>

namespace corodist {

namespace detail {
bool on_loop_thread() noexcept; // event_loop.cpp
[[noreturn]] void throw_blocking_on_loop(const char* what);
void require_running(const asio::execution_context& ctx, const char* what); // event_loop.cpp
} // namespace detail

/// Runs `op` on `ex` and returns its result (or rethrows its exception),
/// blocking the calling thread. Throws `usage_error` when called on an
/// event-loop thread, where blocking would deadlock, and when `ex` belongs to
/// an event_loop that is not running, where it would wait forever. The completion runs on
/// `ex` itself (never on Asio's system executor, whose threads do not survive
/// a fork). `what` names the caller in the error.
/// Cancellation: none from outside (a blocked thread has no slot): `op` runs
/// to its end under its own time limits.
template <typename T>
T run_blocking(const asio::any_io_executor& ex, asio::awaitable<T> op, const char* what = "blocking call") {
  if (detail::on_loop_thread())
    detail::throw_blocking_on_loop(what);
  detail::require_running(asio::query(ex, asio::execution::context), what);
  std::promise<T> p;
  auto f = p.get_future();
  if constexpr (std::is_void_v<T>) {
    asio::co_spawn(ex, std::move(op), asio::bind_executor(ex, [&p](std::exception_ptr e) {
                     if (e)
                       p.set_exception(e);
                     else
                       p.set_value();
                   }));
  } else {
    asio::co_spawn(ex, std::move(op), asio::bind_executor(ex, [&p](std::exception_ptr e, T v) {
                     if (e)
                       p.set_exception(e);
                     else
                       p.set_value(std::move(v));
                   }));
  }
  return f.get();
}

} // namespace corodist
