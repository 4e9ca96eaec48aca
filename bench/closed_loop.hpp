#pragma once
/// \file
/// The closed-loop throughput driver the suites share: `workers` coroutines
/// each keep one operation in flight until `total` have been issued.

#include "harness.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <exception>
#include <utility>

namespace corodist::bench {

/// Runs `op(worker)` (an `asio::awaitable<void>`) from `workers` coroutines on
/// `ex` until `total` operations have been issued, recording each one's
/// latency. Returns the latencies and the elapsed seconds; rethrows the
/// first failure. Must itself run on `ex`.
template <typename Op>
asio::awaitable<std::pair<latency_recorder, double>> run_closed_loop(asio::any_io_executor ex, int workers,
                                                                     std::size_t total, Op op) {
  using clock_type = std::chrono::steady_clock;
  latency_recorder rec(total);
  std::size_t issued = 0;
  int finished = 0;
  std::exception_ptr failure;
  asio::steady_timer done(ex, clock_type::time_point::max());
  const auto start = clock_type::now();
  for (int w = 0; w < workers; ++w)
    asio::co_spawn(
        ex,
        [&, w]() -> asio::awaitable<void> {
          try {
            while (issued < total && !failure) {
              ++issued;
              const auto t0 = clock_type::now();
              co_await op(w);
              rec.add(clock_type::now() - t0);
            }
          } catch (...) {
            failure = std::current_exception();
          }
          if (++finished == workers)
            done.cancel();
        },
        asio::detached);
  co_await done.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  if (failure)
    std::rethrow_exception(failure);
  co_return std::pair{std::move(rec), std::chrono::duration<double>(clock_type::now() - start).count()};
}

} // namespace corodist::bench
