#pragma once
/// \file
/// corodist::run_on: run a function on an executor (a loop, a thread pool) and
/// get its result as a future -- "run here if already there, else post", and
/// "run off the loop, post the result back" in one.

#include <corodist/core/config.hpp>

#include <corodist/core/future.hpp>

#include <asio/dispatch.hpp>

#include <exception>
#include <type_traits>
#include <utility>

namespace corodist {

namespace detail {

/// `fn` as a job that runs it and stores its result (or exception) in a
/// promise, and that promise's future: what run_on and worker_thread post.
template <typename F>
auto packaged_job(F fn) {
  using R = std::invoke_result_t<F&>;
  promise<R> p;
  auto f = p.get_future();
  auto job = [p = std::move(p), fn = std::move(fn)]() mutable {
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
  return std::pair<decltype(job), future<R>>(std::move(job), std::move(f));
}

} // namespace detail

/// Runs `fn()` on `ex` and returns a future of its result (or exception).
/// When the calling thread already runs `ex`, `fn` runs at once, inline;
/// otherwise it is posted. The future is awaited (`co_await f.async_get()`)
/// from any executor and resumes there, so `run_on(pool, work)` is how a
/// coroutine on a loop runs blocking work elsewhere and gets back to its loop.
/// Cancellation: not cancellable: once posted, `fn` runs to its end;
/// cancelling the wait on the future (see `future::async_get`) ends only the
/// wait, and the result stays in the future.
template <typename Executor, typename F>
auto run_on(const Executor& ex, F fn) -> future<std::invoke_result_t<F&>> {
  auto [run, f] = detail::packaged_job(std::move(fn));
  asio::dispatch(ex, std::move(run)); // inline when this thread runs `ex`, else queued
  return std::move(f);
}

} // namespace corodist
