#pragma once
// Work that must outlive its owner for a bounded time on an event loop (a store
// host serving the other ranks' last requests after its own store went). An
// owned event_loop's destructor waits for it, up to the latest deadline any
// of it announced, before stopping its thread.

#include <asio/execution/context.hpp>
#include <asio/execution_context.hpp>
#include <asio/query.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace corodist::detail {

class linger_service : public asio::execution_context::service {
public:
  using key_type = linger_service;
  using clock = std::chrono::steady_clock;
  static asio::execution_context::id id;

  explicit linger_service(asio::execution_context& ctx) : asio::execution_context::service(ctx) {}

  /// One more lingering job, done by `deadline` at the latest (any thread).
  void begin(clock::time_point deadline) {
    std::lock_guard lk(mutex_);
    ++jobs_;
    if (deadline > latest_)
      latest_ = deadline;
  }
  /// A lingering job ended (any thread).
  void end() {
    std::lock_guard lk(mutex_);
    --jobs_;
    cv_.notify_all();
  }
  /// Blocks until no job lingers, or until the latest deadline announced.
  void wait() {
    std::unique_lock lk(mutex_);
    cv_.wait_until(lk, latest_, [&] { return jobs_ == 0; });
  }

private:
  void shutdown() override {}

  std::mutex mutex_;
  std::condition_variable cv_;
  int jobs_ = 0;
  clock::time_point latest_{};
};

/// The linger service of the context `ex` belongs to.
template <typename Executor>
linger_service& linger_of(const Executor& ex) {
  return asio::use_service<linger_service>(asio::query(ex, asio::execution::context));
}

} // namespace corodist::detail
