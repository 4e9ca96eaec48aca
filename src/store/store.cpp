#include <corodist/core/error.hpp>
#include <corodist/store/store.hpp>

namespace corodist::store {

asio::awaitable<void> store::do_barrier(std::string name, std::int64_t world_size, std::chrono::milliseconds timeout) {
  if (world_size <= 0)
    throw store_error("barrier '" + name + "': world_size must be positive");
  const auto arrived = co_await do_add(name + "/count", 1);
  if (arrived > world_size)
    throw store_error("barrier '" + name + "': " + std::to_string(arrived) + " arrivals for world_size " +
                      std::to_string(world_size) + " (barrier names are one-shot)");
  if (arrived == world_size) {
    // The last to arrive releases the others and has nothing to wait for: a
    // wait here could meet a store whose host was released and has gone.
    co_await do_set(name + "/done", "1");
    co_return;
  }
  std::vector<std::string> keys{name + "/done"};
  co_await do_wait(std::move(keys), timeout);
}

} // namespace corodist::store
