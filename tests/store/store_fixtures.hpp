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

#include "support/child_process.hpp"
#include "support/temp_file.hpp"

#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>

#include <future>

#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
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
    // Their threads park while children are forked (child_process.hpp).
    parked_server.emplace(server_loop.get_executor());
    parked_client.emplace(loop.get_executor());
  }
  ~tcp_impl() {
    parked_client.reset();
    parked_server.reset();
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
  std::optional<loop_parking> parked_server, parked_client;
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

/// A store server in a child process with one operation of a client here
/// pending at it, for the tests of a server that dies or hangs: `start`
/// makes the server in the child, `connect` the client here, `pending` the
/// operation (a wait or get that never completes by itself). Once the
/// operation waits at the server, `fail_with(sig)` sends `sig` to the server
/// and returns the text of the connection_error the operation ends with.
struct server_with_a_pending_wait {
  using start_fn = std::function<std::shared_ptr<store::store_server>(event_loop&)>;
  using connect_fn = std::function<std::shared_ptr<store::tcp_store>(event_loop&, std::uint16_t port)>;
  using pending_fn = std::function<asio::awaitable<void>(std::shared_ptr<store::tcp_store>)>;

  pipe_pair port_pipe, waiting_pipe, never;
  std::unique_ptr<child_process> server;
  std::uint16_t port = 0;
  event_loop loop;
  std::shared_ptr<store::tcp_store> client;
  std::future<void> pending;

  server_with_a_pending_wait(const start_fn& start, const connect_fn& connect, const pending_fn& op) {
    server = std::make_unique<child_process>([&]() -> int {
      event_loop l;
      l.start();
      auto srv = start(l);
      std::uint16_t p = srv->local_endpoint().port();
      if (!write_all(port_pipe.write_end(), &p, sizeof p))
        return 1;
      // Tell the parent once its operation waits here, then serve until killed.
      if (!run_blocking(l.get_executor(), srv->wait_until([&] { return srv->pending_waits() == 1; },
                                                          std::chrono::seconds(20))))
        return 2;
      char byte = 'w';
      if (!write_all(waiting_pipe.write_end(), &byte, 1))
        return 1;
      never.close_write();
      read_all(never.read_end(), &byte, 1); // blocks: the parent holds the write end
      return 0;
    });
    BOOST_REQUIRE(read_all(port_pipe.read_end(), &port, sizeof port));
    loop.start();
    client = connect(loop, port);
    pending = asio::co_spawn(loop.get_executor(), op(client), asio::use_future);
    char byte = 0;
    BOOST_REQUIRE(read_all(waiting_pipe.read_end(), &byte, 1)); // the operation waits at the server
  }

  /// Sends `sig` to the server; returns the pending operation's connection_error text.
  std::string fail_with(int sig) {
    ::kill(server->pid(), sig);
    try {
      pending.get();
      BOOST_ERROR("the pending operation did not fail");
    } catch (const connection_error& e) {
      return e.what();
    }
    return {};
  }
};

} // namespace corodist::test
