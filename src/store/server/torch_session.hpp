#pragma once
// One PyTorch TCPStore client connection served by store_server (private).
// Speaks PyTorch 1.13's or 2.x's protocol (told apart by the first query):
// decodes each query (query.hpp), runs it on the server's engine — so native
// and PyTorch clients see the same keys under the same rules and limits — and
// writes PyTorch's responses.

#include <corodist/core/io_registration.hpp>

#include "store/server/engine.hpp"
#include "store/wire/torch/query.hpp"

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace corodist::store::detail::torch {

class session : public std::enable_shared_from_this<session> {
public:
  /// Serves `socket` on `engine` as owner `id`. A client whose unsent
  /// responses pass `max_output` bytes is dropped. `on_close` runs once, on
  /// the loop, when the session ends (not at context shutdown).
  session(asio::ip::tcp::socket socket, std::shared_ptr<engine> eng, engine::owner_id id, std::size_t max_output,
          std::function<void()> on_close);
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  /// Starts reading queries. Call once, on the loop. `late_hello`, for a
  /// connection taken because it stayed silent: where it goes if its first
  /// byte turns out to be a native hello's (a late native client, not a
  /// PyTorch one); the session then ends without touching its bytes.
  void start(std::function<void(asio::ip::tcp::socket)> late_hello = {});
  /// Closes the socket; pending waits are dropped. Idempotent.
  void close();

private:
  asio::awaitable<void> run(std::function<void(asio::ip::tcp::socket)> late_hello);
  /// Decodes and serves one query from the front of `input`; returns the bytes it used, 0 if incomplete.
  std::size_t serve_one(std::span<const std::uint8_t> input);
  void serve(query&& q);
  void queue_output(std::string_view bytes);
  /// Drops the client if queued output passed the cap (a lone response of `added` bytes may).
  void check_output(std::size_t added);
  void flush();
  void finish(bool notify);

  asio::ip::tcp::socket socket_;
  std::shared_ptr<engine> engine_;
  engine::owner_id id_;
  const std::size_t max_output_;
  std::function<void()> on_close_;
  std::string peer_;
  std::optional<version> version_;
  std::string out_;      // responses not yet handed to the socket
  std::string sending_;  // the write in flight
  std::size_t largest_buffer_ = 0; // the read buffer's peak: the heap is trimmed when a large one's connection goes
  bool writing_ = false;
  bool closed_ = false;
  corodist::io_registration registration_; // closes us at context shutdown; last: goes first
};

} // namespace corodist::store::detail::torch
