#pragma once
// One factory per store implementation, for the shared test body: each owns
// the event loops it needs and yields a ready store.

#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/file_store.hpp>
#include <corodist/store/hash_store.hpp>
#include <corodist/store/prefix_store.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>

#include "support/temp_file.hpp"

#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace corodist::test {

/// Blocks this (plain) thread until `condition`, run on `loop`, holds: it is
/// looked at again after each change of `server`'s clients or pending waits
/// (store_server::wait_until), never polled. Returns false after `limit`.
inline bool server_reaches(event_loop& loop, store::store_server& server, std::function<bool()> condition,
                           std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  return run_blocking(loop.get_executor(), server.wait_until(std::move(condition), limit), "server_reaches");
}

struct hash_impl {
  static constexpr const char* name = "hash_store";
  hash_impl() { loop.start(); }
  /// Ranks in one process share the one in-memory store.
  std::shared_ptr<store::store> make() {
    if (!shared)
      shared = std::make_shared<store::hash_store>(loop.get_executor());
    return shared;
  }
  event_loop loop;
  std::shared_ptr<store::store> shared;
};

struct file_impl {
  static constexpr const char* name = "file_store";
  file_impl() { loop.start(); }
  std::shared_ptr<store::store> make() { return std::make_shared<store::file_store>(loop.get_executor(), file.path); }
  temp_file file;
  event_loop loop;
};

struct tcp_impl {
  static constexpr const char* name = "tcp_store";
  tcp_impl() {
    server_loop.start();
    loop.start();
    store::server_options so;
    so.auth_token = "";
    server = store::store_server::start(server_loop.get_executor(), so);
  }
  ~tcp_impl() {
    server.reset();
    loop.stop();
  }
  /// The server's port.
  std::uint16_t port() const { return server->local_endpoint().port(); }
  std::shared_ptr<store::store> make() {
    store::tcp_store_options o;
    o.port = port();
    o.auth_token = "";
    o.timeout = std::chrono::seconds(20);
    return store::tcp_store::connect_sync(loop.get_executor(), o);
  }
  event_loop server_loop;
  event_loop loop;
  std::shared_ptr<store::store_server> server;
};

struct prefix_impl {
  static constexpr const char* name = "prefix_store";
  prefix_impl() { loop.start(); }
  std::shared_ptr<store::store> make() {
    if (!inner)
      inner = std::make_shared<store::hash_store>(loop.get_executor());
    return std::make_shared<store::prefix_store>("group0", inner);
  }
  event_loop loop;
  std::shared_ptr<store::store> inner;
};

} // namespace corodist::test
