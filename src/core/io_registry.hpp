#pragma once
// Closes the sockets, acceptors and timers of live I/O objects (net/'s
// connections and listeners) when their io_context shuts down. Asio destroys suspended coroutine frames only after
// it has destroyed the socket and timer services (Asio issue 1235); a frame
// that owns the last reference to a connection would then close its socket
// through a freed service. Closing everything here, while every service is
// still alive, leaves nothing for those late destructors to touch.
#include <asio/execution/context.hpp>
#include <asio/execution_context.hpp>
#include <asio/query.hpp>

#include <functional>
#include <mutex>
#include <unordered_map>

namespace corodist::detail {

class io_registry : public asio::execution_context::service {
public:
  using key_type = io_registry;
  static asio::execution_context::id id;

  explicit io_registry(asio::execution_context& ctx) : asio::execution_context::service(ctx) {}

  /// Registers `close_fn(final)`: run with final = false by close_all(), and
  /// with final = true at shutdown, after which the registry is gone.
  void add(const void* obj, std::function<void(bool final)> close_fn) {
    std::lock_guard lk(mutex_);
    live_[obj] = std::move(close_fn);
  }

  void remove(const void* obj) {
    std::lock_guard lk(mutex_);
    live_.erase(obj);
  }

  /// Closes every registered object (they stay registered). event_loop calls
  /// this before draining, so that pending operations end while the loop can
  /// still run their handlers.
  void close_all() {
    std::unordered_map<const void*, std::function<void(bool)>> live;
    {
      std::lock_guard lk(mutex_);
      live = live_;
    }
    for (auto& [obj, close_fn] : live)
      close_fn(false);
  }

private:
  void shutdown() override {
    std::unordered_map<const void*, std::function<void(bool)>> live;
    {
      std::lock_guard lk(mutex_);
      live.swap(live_);
    }
    for (auto& [obj, close_fn] : live)
      close_fn(true);
  }

  std::mutex mutex_;
  std::unordered_map<const void*, std::function<void(bool)>> live_;
};

/// The registry of the context `ex` belongs to.
template <typename Executor>
io_registry& registry_of(const Executor& ex) {
  return asio::use_service<io_registry>(asio::query(ex, asio::execution::context));
}

} // namespace corodist::detail
