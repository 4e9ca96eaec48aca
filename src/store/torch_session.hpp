#pragma once
// One PyTorch TCPStore client connection served by store_server (private).
// Speaks PyTorch 1.13's or 2.x's protocol (told apart by the first query) on
// the server's shared kv_state, so native and PyTorch clients see the same keys.

#include <corodist/core/detail/io_registration.hpp>
#include <corodist/store/store_server.hpp>

#include "store/kv_state.hpp"
#include "store/torch_wire.hpp"

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace corodist::store::detail {

class torch_session : public std::enable_shared_from_this<torch_session> {
public:
  /// `limits`: the server's options (its size and count limits apply).
  /// `on_close` runs once, on the loop, when the session ends (not at context shutdown).
  torch_session(asio::ip::tcp::socket socket, std::shared_ptr<kv_state> state, kv_state::owner_id id,
                const server_options& limits, std::function<void()> on_close);
  ~torch_session();
  torch_session(const torch_session&) = delete;
  torch_session& operator=(const torch_session&) = delete;

  /// Starts reading queries. Call once, on the loop.
  void start();
  /// Closes the socket; pending waits are dropped. Idempotent.
  void close();

private:
  asio::awaitable<void> run();
  /// Parses and serves one query from `data`; returns the bytes it used, 0 if incomplete.
  std::size_t serve_one(const std::uint8_t* data, std::size_t size);
  void queue_output(std::string_view bytes);
  /// Drops the client if queued output passed the cap (a lone response of `added` bytes may).
  void check_output(std::size_t added);
  void flush();
  void finish(bool notify);

  asio::ip::tcp::socket socket_;
  std::shared_ptr<kv_state> state_;
  kv_state::owner_id id_;
  const std::size_t max_key_;
  const std::size_t max_value_;
  const std::size_t max_keys_;
  const std::size_t max_output_;
  std::function<void()> on_close_;
  std::string peer_;
  std::optional<torch::version> version_;
  std::string out_;      // responses not yet handed to the socket
  std::string sending_;  // the write in flight
  bool writing_ = false;
  bool closed_ = false;
  corodist::detail::io_registration registration_; // closes us at context shutdown; last: goes first
};

} // namespace corodist::store::detail
