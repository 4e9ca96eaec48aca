#pragma once
// The streams of one agent (private): the registered stream functions, the
// streams this worker opened (by id) and those it serves (by connection and
// id), the frames routed to them, and what ends them when a connection closes
// or the agent stops. Loop-affine, except where noted.

#include <corodist/core/timeout.hpp>
#include <corodist/net/connection.hpp>
#include <corodist/rpc/detail/stream_core.hpp>
#include <corodist/rpc/detail/stream_function.hpp>
#include <corodist/rpc/payload.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

namespace corodist::rpc::detail {

class agent_core;

class stream_table : public std::enable_shared_from_this<stream_table> {
public:
  stream_table(std::size_t window_items, std::size_t window_bytes);

  /// Registers a stream function (before start).
  void add_function(std::string name, stream_function f);
  /// The agent whose connections and gates streams use (at start).
  void set_owner(std::weak_ptr<agent_core> owner) { owner_ = std::move(owner); }
  /// A new stream id (any thread).
  std::uint64_t next_id() noexcept { return next_id_.fetch_add(1) + 1; }
  /// This worker's receive window.
  std::size_t window_items() const noexcept { return window_items_; }
  std::size_t window_bytes() const noexcept { return window_bytes_; }

  /// Opens client stream `core` to its peer with the encoded open `body`, within `by`.
  void open(std::shared_ptr<stream_core> core, payload body, corodist::deadline by);
  /// A stream frame arrived on a connection this worker accepted (from its client).
  void on_server_frame(int from, const std::string& from_name, const std::shared_ptr<net::connection>& conn,
                       net::message&& m);
  /// A stream frame arrived on a connection this worker dialled to `rank` (from a server).
  void on_client_frame(int rank, const std::shared_ptr<net::connection>& conn, net::message&& m);
  /// Connection `conn` (to or from worker `rank`) closed: its streams fail.
  void on_closed(const net::connection* conn, int rank);
  /// Forgets a finished stream.
  void release(stream_core& c);
  /// Fails every stream (the agent closes). Later opens fail.
  void close_all();
  /// Streams open here, as client or server (any thread).
  std::size_t open_streams() const noexcept { return open_count_.load(); }

private:
  struct server_key {
    const net::connection* conn;
    std::uint64_t id;
    bool operator==(const server_key&) const = default;
  };
  struct key_hash {
    std::size_t operator()(const server_key& k) const noexcept {
      return std::hash<const void*>()(k.conn) ^ (k.id * 0x9e3779b97f4a7c15ull);
    }
  };
  void serve_open(int from, const std::string& from_name, const std::shared_ptr<net::connection>& conn,
                  net::message&& m, std::chrono::steady_clock::time_point arrived);

  const std::size_t window_items_;
  const std::size_t window_bytes_;
  std::weak_ptr<agent_core> owner_;
  std::unordered_map<std::string, stream_function> functions_; // immutable once started
  std::unordered_map<std::uint64_t, std::shared_ptr<stream_core>> clients_;
  std::unordered_map<server_key, std::shared_ptr<stream_core>, key_hash> servers_;
  std::atomic<std::uint64_t> next_id_{0};
  std::atomic<std::size_t> open_count_{0};
  bool closed_ = false;
};

} // namespace corodist::rpc::detail
