#pragma once
// One native client connection served by store_server (private): decodes each
// request frame (request.hpp), runs it on the engine, and writes the reply
// (reply.hpp). Watch events go out on the same connection.

#include <corodist/net/connection.hpp>

#include "store/server/engine.hpp"
#include "store/wire/native/request.hpp"

#include <cstdint>
#include <memory>
#include <unordered_map>

namespace corodist::store::detail {

/// Kept small and by value in the server's table (a server holds one per
/// connection); the server's connection callbacks find it by its id.
class native_session {
public:
  /// A session of `eng` as owner `id` on `conn`. `eng` must outlive it.
  native_session(std::weak_ptr<net::connection> conn, engine& eng, engine::owner_id id)
      : conn_(std::move(conn)), engine_(eng), id_(id) {}
  native_session(const native_session&) = delete;
  native_session& operator=(const native_session&) = delete;

  /// Serves one frame from `conn`. The session must stay alive through the
  /// call even if it closes the connection (the server erases closed
  /// sessions in a later turn of the loop).
  void handle(const std::shared_ptr<net::connection>& conn, net::message&& m);

  /// The connection has closed: drops the session's waits and watches from
  /// the engine, and deletes the keys it still owns (set_owned).
  void closed();

  /// The largest request payload this session has received, in bytes.
  std::size_t largest_request() const noexcept { return largest_request_; }
  /// Closes the connection (closed() follows from its close handler). Idempotent.
  void close();

private:
  void serve(const std::shared_ptr<net::connection>& conn, std::uint64_t rid, request&& r);
  /// Answers request `rid` once every key exists (with `answer(keys)`'s
  /// result fields) or with a timeout reply when `timeout` passes.
  template <typename Answer>
  void answer_when_present(std::uint64_t rid, op kind, std::vector<std::string> keys,
                           std::chrono::milliseconds timeout, Answer answer);

  std::weak_ptr<net::connection> conn_;
  engine& engine_;
  engine::owner_id id_;
  std::size_t largest_request_ = 0; // payload bytes: the heap is trimmed when a large one's connection goes
  std::unique_ptr<std::unordered_map<std::uint64_t, std::uint64_t>> watches_; // client id -> engine id; on first watch
};

} // namespace corodist::store::detail
