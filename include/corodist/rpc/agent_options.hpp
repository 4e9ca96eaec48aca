#pragma once
/// \file
/// corodist::rpc::agent_options: how an RPC agent joins its job, and its limits.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <corodist/net/connection.hpp>
#include <corodist/net/tls.hpp>
#include <corodist/store/store.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace corodist::rpc {

using namespace std::chrono_literals;

/// Settings of an `rpc::agent`. Defaults are the named constants.
///
/// Either `store` (with `rank` and `world_size`) or `init_method` (a
/// rendezvous URL, see `store::async_rendezvous`; it supplies the store, rank
/// and world size) must be given.
struct agent_options {
  static constexpr std::chrono::milliseconds default_rpc_timeout = 60s;
  static constexpr std::chrono::milliseconds default_init_timeout = 300s;
  static constexpr std::chrono::milliseconds default_shutdown_timeout = 300s;
  static constexpr std::size_t default_worker_threads = 4;
  static constexpr std::size_t default_max_message_size = std::size_t{1} << 30; // 1 GiB
  static constexpr std::size_t default_max_buffered_output_per_peer = std::size_t{256} << 20;
  static constexpr std::size_t default_max_buffered_output = std::size_t{1} << 30;
  static constexpr const char* default_key_prefix = "corodist/rpc/";
  static constexpr std::size_t default_stream_window_items = 1024;
  static constexpr std::size_t default_stream_window_bytes = std::size_t{4} << 20; // 4 MiB
  /// peer_timeout's default unless CORODIST_PEER_TIMEOUT_MS says otherwise.
  static constexpr std::chrono::milliseconds default_peer_timeout = net::connection_options::default_peer_timeout;

  /// This worker's name; unique in the job (a duplicate fails start()).
  std::string name;
  /// This worker's rank in [0, world_size).
  int rank = -1;
  /// Number of workers in the job.
  int world_size = 0;
  /// The job's shared store (worker addresses, shutdown barrier). The agent's
  /// keys start with `key_prefix`, so one rendezvous' store serves the agent,
  /// process groups (keys under "corodist/pg/") and the program's own keys.
  std::shared_ptr<corodist::store::store> store;
  /// Rendezvous URL used when `store` is null (env://, tcp://, file://). A
  /// later rendezvous of the same job in this process (a gloo_group's URL)
  /// shares the store it yields (see `store::async_rendezvous`).
  std::string init_method;
  /// Time limit of every call made without one of its own (`never()`:
  /// none; `inherit()`: default_rpc_timeout). A per-call timeout, passed
  /// first (`rpc.call<int>(500ms, "w1", "f")`), overrides it.
  corodist::timeout rpc_timeout = default_rpc_timeout;
  /// Time limit of start(): waiting for all workers to publish their address
  /// (`inherit()`: default_init_timeout).
  corodist::timeout init_timeout = default_init_timeout;
  /// Time limit of a graceful shutdown as a whole (own calls, the join's
  /// barriers, the upper layers' steps and the barriers behind them;
  /// `inherit()`: default_shutdown_timeout).
  corodist::timeout shutdown_timeout = default_shutdown_timeout;
  /// Failure detection on the connections to peers (see
  /// net::connection_options::peer_timeout): a peer that sends nothing, not
  /// even a heartbeat, for this long is lost; so is one whose connection
  /// closes. Calls pending to a lost peer, and later ones, fail with
  /// peer_lost_error (no retry, as PyTorch's RPC). `never()`: off. Default:
  /// CORODIST_PEER_TIMEOUT_MS if set, else default_peer_timeout (10 s).
  corodist::timeout peer_timeout = net::configured_peer_timeout();
  /// Threads of the pool that runs plain (non-coroutine) functions.
  std::size_t worker_threads = default_worker_threads;
  /// Largest call or reply (msgpack body plus attachments), both directions.
  std::size_t max_message_size = default_max_message_size;
  /// The memory held for one peer's replies: those queued on its connection
  /// and being written, those encoded and on their way there, and its calls
  /// running, each at twice the largest reply sent to that peer so far (its
  /// value and the value's encoding). A call that would take it over is not
  /// started: it waits, and the agent stops reading that peer's connection,
  /// until the output drains (flow control; other peers are not affected;
  /// calls the worker threads began before a first reply to that peer showed
  /// its size are not held back). A
  /// peer whose output then makes no progress for peer_timeout does not read
  /// and is dropped with a warning naming it (so is one whose output passes
  /// this cap all the same); its calls fail with connection_error. A single
  /// message larger than this is still sent, one at a time; raise it for
  /// bursts of very large replies to one peer.
  std::size_t max_buffered_output_per_peer = default_max_buffered_output_per_peer;
  /// Output queued for all connections of the agent together; over it, the
  /// connection that holds a quarter of it or more is dropped.
  std::size_t max_buffered_output = default_max_buffered_output;
  /// Connections accepted at once; more are refused. 0: the process's
  /// open-file limit less 64.
  std::size_t max_connections = 0;
  /// Address to listen on (port 0: the kernel picks) and to publish to peers.
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  /// rpc_sync polls for its reply this long before sleeping (0: sleeps at
  /// once). Spinning saves the wake-up of the calling thread (tens of µs on a
  /// VM whose idle vCPUs halt) at the cost of a busy core meanwhile.
  std::chrono::microseconds sync_spin{0};
  /// The receive window of each stream this agent reads (flow control): a
  /// writer at the other end may have at most this many items, and this many
  /// bytes (plus one item), sent and not yet taken by this end's reader; then
  /// its write() waits. The reader gives credit back as it takes items (a
  /// quarter of the window at a time, or whenever it has read everything).
  std::size_t stream_window_items = default_stream_window_items;
  std::size_t stream_window_bytes = default_stream_window_bytes;
  /// Prefix of the agent's keys in the store.
  std::string key_prefix = default_key_prefix;
  /// Token peers must prove when connecting (HMAC hello). nullopt:
  /// CORODIST_AUTH_TOKEN if set; "": none.
  std::optional<std::string> auth_token;
  /// TLS for the RPC channels (the listener and every dialled connection;
  /// docs/tls.md) and for the store of a rendezvous made from init_method.
  /// nullopt: from CORODIST_TLS_* (net::tls_options_from_env()); options that
  /// are not enabled(): plain TCP. A dialled peer's certificate is checked
  /// against the address it published (an IP subject alternative name) unless
  /// server_name is set. Bad files make start() throw usage_error.
  std::optional<net::tls_options> tls;
};

} // namespace corodist::rpc
