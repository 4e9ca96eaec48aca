#include <corodist/core/run_blocking.hpp>
#include <corodist/store/connect_store.hpp>
#include <corodist/store/tcp_store.hpp>
#include <corodist/store/torch_store.hpp>

namespace corodist::store {

asio::awaitable<std::shared_ptr<store>> connect_store(asio::any_io_executor ex, tcp_store_options opts) {
  if (opts.protocol == wire_protocol::native)
    co_return co_await tcp_store::connect(std::move(ex), std::move(opts));
  co_return co_await torch_store::connect(std::move(ex), std::move(opts));
}

std::shared_ptr<store> connect_store_sync(asio::any_io_executor ex, tcp_store_options opts) {
  return run_blocking(ex, connect_store(ex, std::move(opts)), "connect_store_sync");
}

} // namespace corodist::store
