#pragma once
// A store_server on a loop of its own: the launcher's store, for suites whose
// ranks are forked processes.

#include <corodist/core/event_loop.hpp>
#include <corodist/store/store_server.hpp>

#include <cstdint>
#include <memory>

namespace corodist::bench {

struct store_host {
  event_loop loop;
  std::shared_ptr<store::store_server> server;
  store_host() {
    loop.start();
    store::server_options so;
    so.host = "127.0.0.1";
    so.port = 0;
    server = store::store_server::start(loop.get_executor(), so);
  }
  ~store_host() { server->stop(); }
  std::uint16_t port() const { return server->local_endpoint().port(); }
};

} // namespace corodist::bench
