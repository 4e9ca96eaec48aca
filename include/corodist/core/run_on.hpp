#pragma once
/// \file
/// corodist::run_on: run a function on an executor (a loop, a thread pool) and
/// get its result as a future -- "run here if already there, else post", and
/// "run off the loop, post the result back" in one.

#include <corodist/core/future.hpp>

#include <asio/dispatch.hpp>

#include <exception>
#include <type_traits>
#include <utility>

namespace corodist {

/// Runs `fn()` on `ex` and returns a future of its result (or exception).
/// When the calling thread already runs `ex`, `fn` runs at once, inline;
/// otherwise it is posted. The future is awaited (`co_await f.async_get()`)
/// from any executor and resumes there, so `run_on(pool, work)` is how a
/// coroutine on a loop runs blocking work elsewhere and gets back to its loop.
template <typename Executor, typename F>
auto run_on(const Executor& ex, F fn) -> future<std::invoke_result_t<F&>> {
  using R = std::invoke_result_t<F&>;
  promise<R> p;
  auto f = p.get_future();
  auto run = [p = std::move(p), fn = std::move(fn)]() mutable {
    try {
      if constexpr (std::is_void_v<R>) {
        fn();
        p.set_value();
      } else {
        p.set_value(fn());
      }
    } catch (...) {
      p.set_exception(std::current_exception());
    }
  };
  asio::dispatch(ex, std::move(run)); // inline when this thread runs `ex`, else queued
  return f;
}

} // namespace corodist
