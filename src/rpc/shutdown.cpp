// Graceful shutdown of rpc::agent: PyTorch's _wait_all_workers on the store
// (join rounds until no call moved), then upper layers' steps, then close --
// all within one deadline, shutdown_timeout from the call.
#include "rpc/agent_core.hpp"

#include <corodist/core/error.hpp>
#include <corodist/store/errors.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"

#include <asio/steady_timer.hpp>

namespace corodist::rpc::detail {

namespace {
// Half of what is left of `by`: a shutdown step's deadline.
corodist::deadline half_of(corodist::deadline by) {
  return by.is_never() ? by : corodist::deadline::after(by.remaining() / 2);
}
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
    // A peer closes only once every worker, this one included, is in shutdown.
    channels_->expect_peers_to_close();
    const auto deadline = shutdown_limit().from();
    try {
      // As PyTorch: every worker idle first (no user call anywhere), then the
      // upper layers' cleanup (which still talks over the open connections).
      co_await join(deadline);
      // Every worker ends a step before any goes on (a step's last messages
      // -- acknowledgements -- find their receivers still open). A step gets
      // half the time left: the rest is the barrier's, where the workers whose
      // step ended sooner wait for the others. A step that fails is reported
      // at the end; the barrier behind it is still passed, so that no other
      // worker waits for this one in vain.
      int n = 0;
      for (auto& [name, step] : shutdown_steps_) {
        CORODIST_LOG_DEBUG("rpc: agent '{}' shutdown step '{}'", opts_.name, name);
        try {
          co_await step(half_of(deadline));
        } catch (const std::exception& e) {
          CORODIST_LOG_WARN("rpc: agent '{}' shutdown: step '{}' failed: {}", opts_.name, name, e.what());
          if (!failure)
            failure = std::current_exception();
        }
        co_await in_phase("not every worker finished step '" + name + "'",
                          store_->barrier(opts_.key_prefix + "shutdown_step/" + std::to_string(n++),
                                          opts_.world_size, deadline.left()));
      }
      co_await leave(opts_.key_prefix + "join/left", deadline);
    } catch (...) {
      failure = std::current_exception(); // the wait that gave up (a step's failure matters less)
    }
  }
  state_ = agent_state::stopped;
  close_all();
  CORODIST_LOG_DEBUG("rpc: agent '{}' closed", opts_.name);
  if (failure)
    std::rethrow_exception(failure);
}

// Awaits `op`, a wait of graceful shutdown: its failure, rethrown with the same
// type, says what the agent was waiting for.
asio::awaitable<void> agent_core::in_phase(std::string what, asio::awaitable<void> op) {
  const auto prefix = "rpc: agent '" + opts_.name + "' shutdown: " + what + " within shutdown_timeout (" +
                      shutdown_limit().str() + "): ";
  try {
    co_await std::move(op);
  } catch (const timeout_error& e) {
    throw timeout_error(prefix + e.what());
  } catch (const connection_error& e) {
    throw connection_error(prefix + e.what());
  } catch (const store::store_error& e) {
    throw store::store_error(prefix + e.what());
  }
}

// Waits until this worker has no call of its own in flight and serves none.
asio::awaitable<void> agent_core::wait_idle(corodist::deadline deadline) {
  auto both = [this]() -> asio::awaitable<int> {
    co_await outgoing_.wait_idle().async_get();
    co_await dispatcher_->serving().wait_idle().async_get();
    co_return 0;
  };
  // A call may start again in between (another thread's rpc_async): look again.
  while (outgoing_.count() + dispatcher_->serving().count() > 0) {
    if (!co_await corodist::detail::within(both(), deadline))
      throw timeout_error("rpc: agent '" + opts_.name + "' shutdown: " + std::to_string(outgoing_.count()) +
                          " outgoing and " + std::to_string(dispatcher_->serving().count()) +
                          " incoming calls still in flight after shutdown_timeout (" + shutdown_limit().str() +
                          ")");
  }
}

// PyTorch's _wait_all_workers, on the store: in rounds, each worker waits
// until it has no call of its own in flight (outgoing or being served),
// publishes how many messages it has sent plus received so far, and passes a
// barrier. When every worker's count is the same as in the previous round,
// nobody did anything in between: no message is in flight anywhere.
asio::awaitable<void> agent_core::join(corodist::deadline deadline) {
  const auto& pre = opts_.key_prefix;
  std::vector<std::string> previous;
  constexpr int max_rounds = 10000;
  for (int round = 0; round < max_rounds; ++round) {
    co_await wait_idle(deadline);
    const auto base = pre + "join/" + std::to_string(round);
    CORODIST_LOG_DEBUG("rpc: agent '{}' shutdown round {}", opts_.name, round);
    co_await store_->set(base + "/" + std::to_string(opts_.rank),
                         std::to_string(calls_sent_.load() + dispatcher_->received()));
    co_await in_phase("not every worker joined", store_->barrier(base, opts_.world_size, deadline.left()));
    std::vector<std::string> keys;
    for (int r = 0; r < opts_.world_size; ++r)
      keys.push_back(base + "/" + std::to_string(r));
    auto counts = co_await store_->multi_get(std::move(keys), deadline.left());
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
asio::awaitable<void> agent_core::leave(std::string base, corodist::deadline deadline) {
  co_await store_->set(base + "/" + std::to_string(opts_.rank), "1");
  if (opts_.rank != 0)
    co_return;
  std::vector<std::string> keys;
  for (int r = 1; r < opts_.world_size; ++r)
    keys.push_back(base + "/" + std::to_string(r));
  if (!keys.empty())
    co_await in_phase("not every worker left", store_->wait(std::move(keys), deadline.left()));
}

} // namespace corodist::rpc::detail
