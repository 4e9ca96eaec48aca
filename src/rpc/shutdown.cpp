// Graceful shutdown of rpc::agent: PyTorch's _wait_all_workers on the store
// (join rounds until no call moved), then upper layers' steps, then close.
#include "rpc/agent_core.hpp"

#include <corodist/core/error.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"

#include <asio/steady_timer.hpp>

namespace corodist::rpc::detail {

namespace {
using clock = std::chrono::steady_clock;
} // namespace

asio::awaitable<void> agent_core::shutdown(bool graceful) {
  auto self = shared_from_this();
  if (shutting_down_) { // a second caller shares the first one's outcome
    co_await shutting_down_->async_get();
    co_return;
  }
  if (state_ == agent_state::created || state_ == agent_state::stopped) {
    state_ = agent_state::stopped;
    co_return;
  }
  if (state_ == agent_state::starting)
    throw usage_error("rpc: agent '" + opts_.name + "': shutdown() while start() is running");
  promise<void> outcome;
  shutting_down_ = outcome.get_future().share();
  try {
    co_await run_shutdown(graceful);
    outcome.set_value();
  } catch (...) {
    outcome.set_exception(std::current_exception());
    throw;
  }
}

asio::awaitable<void> agent_core::run_shutdown(bool graceful) {
  std::exception_ptr failure;
  if (graceful) {
    try {
      // As PyTorch: every worker idle first (no user call anywhere), then the
      // upper layers' cleanup (which still talks over the open connections).
      co_await join();
      // Every worker ends a step before any goes on (a step's last messages
      // -- acknowledgements -- find their receivers still open).
      int n = 0;
      for (auto& [name, step] : shutdown_steps_) {
        CORODIST_LOG_DEBUG("rpc: agent '{}' shutdown step '{}'", opts_.name, name);
        co_await step(opts_.shutdown_timeout);
        co_await store_->barrier(opts_.key_prefix + "shutdown_step/" + std::to_string(n++), opts_.world_size,
                                 opts_.shutdown_timeout);
      }
      co_await leave(opts_.key_prefix + "join/left");
    } catch (...) {
      failure = std::current_exception();
    }
  }
  state_ = agent_state::stopped;
  close_all();
  CORODIST_LOG_DEBUG("rpc: agent '{}' closed", opts_.name);
  if (failure)
    std::rethrow_exception(failure);
}

// Waits until this worker has no call of its own in flight and serves none.
asio::awaitable<void> agent_core::wait_idle(std::chrono::milliseconds timeout) {
  auto both = [this]() -> asio::awaitable<int> {
    co_await outgoing_.wait_idle().async_get();
    co_await dispatcher_->serving().wait_idle().async_get();
    co_return 0;
  };
  // A call may start again in between (another thread's rpc_async): look again.
  const auto deadline = clock::now() + timeout;
  while (outgoing_.count() + dispatcher_->serving().count() > 0) {
    if (!co_await corodist::detail::within(both(), deadline - clock::now()))
      throw timeout_error("rpc: agent '" + opts_.name + "' shutdown: " + std::to_string(outgoing_.count()) +
                          " outgoing and " + std::to_string(dispatcher_->serving().count()) +
                          " incoming calls still in flight after " + std::to_string(timeout.count()) + " ms");
  }
}

// PyTorch's _wait_all_workers, on the store: in rounds, each worker waits
// until it has no call of its own in flight (outgoing or being served),
// publishes how many messages it has sent plus received so far, and passes a
// barrier. When every worker's count is the same as in the previous round,
// nobody did anything in between: no message is in flight anywhere.
asio::awaitable<void> agent_core::join() {
  const auto& pre = opts_.key_prefix;
  std::vector<std::string> previous;
  constexpr int max_rounds = 10000;
  for (int round = 0; round < max_rounds; ++round) {
    co_await wait_idle(opts_.shutdown_timeout);
    const auto base = pre + "join/" + std::to_string(round);
    CORODIST_LOG_DEBUG("rpc: agent '{}' shutdown round {}", opts_.name, round);
    co_await store_->set(base + "/" + std::to_string(opts_.rank),
                         std::to_string(calls_sent_.load() + dispatcher_->received()));
    co_await store_->barrier(base, opts_.world_size, opts_.shutdown_timeout);
    std::vector<std::string> keys;
    for (int r = 0; r < opts_.world_size; ++r)
      keys.push_back(base + "/" + std::to_string(r));
    auto counts = co_await store_->multi_get(std::move(keys), opts_.shutdown_timeout);
    if (round > 0 && counts == previous)
      co_return;
    previous = std::move(counts);
  }
  throw timeout_error("rpc: agent '" + opts_.name + "' shutdown: calls kept starting for " +
                      std::to_string(max_rounds) + " rounds");
}

// The last step of shutdown: every worker says it has left, and rank 0 (which
// hosts the store under env:// and tcp:// rendezvous) waits until all have, so
// that its store outlives every other worker's last request.
asio::awaitable<void> agent_core::leave(std::string base) {
  co_await store_->set(base + "/" + std::to_string(opts_.rank), "1");
  if (opts_.rank != 0)
    co_return;
  std::vector<std::string> keys;
  for (int r = 1; r < opts_.world_size; ++r)
    keys.push_back(base + "/" + std::to_string(r));
  if (!keys.empty())
    co_await store_->wait(std::move(keys), opts_.shutdown_timeout);
}

} // namespace corodist::rpc::detail
