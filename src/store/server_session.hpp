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
  /// Serves `conn` (unstarted) on `engine` as owner `id`.
  server_session(std::shared_ptr<net::connection> conn, std::shared_ptr<engine> eng, engine::owner_id id);
  server_session(const server_session&) = delete;
  server_session& operator=(const server_session&) = delete;

  /// Starts the connection. `on_close` runs once, on the loop, when it closes
  /// (the session's waits and watches are dropped from the engine first).
  void start(std::function<void()> on_close);

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

  std::weak_ptr<net::connection> conn_;
  std::shared_ptr<net::connection> unstarted_; // until start()
  std::shared_ptr<engine> engine_;
  engine::owner_id id_;
  std::unordered_map<std::uint64_t, std::uint64_t> watches_; // client watch id -> engine watch id
};

} // namespace corodist::store::detail
