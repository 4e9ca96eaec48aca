// PyTorch 1.13's store-based barrier over a job's store.
#include "collective/gloo/pytorch_barrier.hpp"

#include <corodist/core/error.hpp>

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <chrono>

namespace corodist::collective::detail {

asio::awaitable<void> pytorch_store_barrier(store::store& job, int group_index, int world_size,
                                            corodist::timeout limit, const std::string& what) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + limit.length();
  const auto key = fmt::format("store_based_barrier_key:{}", group_index + 1);
  (void)co_await job.add(key, 1);
  asio::steady_timer timer(co_await asio::this_coro::executor);
  for (;;) {
    const auto arrived = co_await job.add(key, 0);
    if (arrived >= world_size)
      break;
    if (clock::now() >= deadline)
      throw timeout_error(fmt::format("{}: only {} of {} ranks reached PyTorch's store-based barrier ('{}') within {} ms",
                                      what, arrived, world_size, key, limit.length().count()));
    timer.expires_after(std::chrono::milliseconds(10)); // as PyTorch polls
    co_await timer.async_wait(asio::use_awaitable);
  }
}

} // namespace corodist::collective::detail
