#include <corodist/core/error.hpp>
#include <corodist/store/store.hpp>


#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <typeinfo>

namespace corodist::store {

asio::awaitable<void> store::do_set_owned(std::string key, std::string /*value*/) {
  const char* mangled = typeid(*this).name();
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> name(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), &std::free);
  throw usage_error("set_owned('" + key + "'): this store (" + (status == 0 && name ? name.get() : mangled) +
                    ") has no owned keys; a tcp_store (or a prefix_store over one) has them");
  co_return;
}

void store::throw_expired() {
  throw timeout_error("store: the operation's deadline had passed before it started (nothing was sent)");
}

asio::awaitable<void> store::do_barrier(std::string name, std::int64_t world_size, corodist::deadline by) {
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
  co_await do_wait(std::move(keys), by);
}

} // namespace corodist::store
