#pragma once
// One native client connection served by store_server (private): decodes each
// request frame (request.hpp), runs it on the engine, and writes the reply
// (reply.hpp). Watch events go out on the same connection.

#include <corodist/net/connection.hpp>

#include "store/engine.hpp"
#include "store/request.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>

namespace corodist::store::detail {

class server_session : public std::enable_shared_from_this<server_session> {
public:
  /// Tells the session's owner that session `id` has closed (its waits and
  /// watches already dropped from the engine). Called on the loop.
  using closed_fn = std::function<void(engine::owner_id id)>;

  /// A session of `eng` as owner `id`. `eng` and `on_closed` must outlive it
  /// (the store_server owns both and every session).
  server_session(engine& eng, engine::owner_id id, const closed_fn& on_closed)
      : engine_(eng), id_(id), on_closed_(on_closed) {}
  server_session(const server_session&) = delete;
  server_session& operator=(const server_session&) = delete;

  /// Starts serving `conn` (unstarted). Call once, on the loop.
  void start(const std::shared_ptr<net::connection>& conn);

  /// Closes the connection. Idempotent.
  void close();

private:
  void handle(const std::shared_ptr<net::connection>& conn, net::message&& m);
  void serve(const std::shared_ptr<net::connection>& conn, std::uint64_t rid, request&& r);
  /// Answers request `rid` once every key exists (with `answer(keys)`'s
  /// result fields) or with a timeout reply when `timeout` passes.
  template <typename Answer>
  void answer_when_present(std::uint64_t rid, op kind, std::vector<std::string> keys,
                           std::chrono::milliseconds timeout, Answer answer);

  // Kept small: a server holds one per connection.
  std::weak_ptr<net::connection> conn_;
  engine& engine_;
  engine::owner_id id_;
  const closed_fn& on_closed_;
  std::unique_ptr<std::unordered_map<std::uint64_t, std::uint64_t>> watches_; // client id -> engine id; on first watch
};

} // namespace corodist::store::detail
