#pragma once
/// \file
/// corodist::rpc::message_port: the extension point that layers above rpc/
/// (rref/) use to talk between workers without knowing sockets -- a handler
/// per message kind, requests answered by futures, one-way notifications,
/// running a registered function locally, and steps in graceful shutdown.

#include <corodist/core/config.hpp>

#include <corodist/core/unique_function.hpp>
#include <corodist/core/future.hpp>
#include <corodist/net/connection.hpp>
#include <corodist/rpc/call_context.hpp>
#include <corodist/rpc/codec_context.hpp>
#include <corodist/rpc/payload.hpp>
#include <corodist/rpc/worker_info.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <msgpack/object_fwd_decl.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <typeindex>
#include <unordered_map>


namespace corodist::rpc {

/// A frame kind (net::frame_header::kind). rpc/ uses [0x0500, 0x0600); an
/// upper layer picks kinds outside that range.
using message_kind = std::uint16_t;
inline constexpr message_kind rpc_kinds_begin = 0x0500;
inline constexpr message_kind rpc_kinds_end = 0x0600;

/// A message as its handler receives it, on the loop.
struct inbound_message {
  /// The sender's rank; -1 for a connection that did not identify itself.
  int from = -1;
  message_kind kind = 0;
  /// A notification: nothing is expected back.
  bool one_way = false;
  /// The frame payload (an encoded rpc::payload); decode it with
  /// rpc::parse_payload (codec.hpp) under a codec_context (message_port::decode_context).
  net::bytes payload;
};

/// Answers one request: exactly one of reply() or fail(). A responder dropped
/// unanswered answers with an error ("dropped without a reply"). Loop-affine
/// or not: it may be completed from any thread.
class responder {
public:
  using reply_fn = corodist::unique_function<void(payload)>;
  using fail_fn = corodist::unique_function<void(std::exception_ptr)>;

  responder() = default;
  responder(reply_fn r, fail_fn f) : reply_(std::move(r)), fail_(std::move(f)) {}
  responder(responder&&) noexcept = default;
  responder& operator=(responder&&) noexcept = default;
  ~responder() {
    if (fail_)
      fail(std::make_exception_ptr(error("the request was dropped without a reply")));
  }

  /// Sends `p` as the reply.
  void reply(payload p) {
    fail_ = {};
    if (auto r = std::move(reply_)) {
      reply_ = {};
      r(std::move(p));
    }
  }
  /// Sends the exception: the requester gets remote_error with its type and message.
  void fail(std::exception_ptr e) {
    reply_ = {};
    if (auto f = std::move(fail_)) {
      fail_ = {};
      f(std::move(e));
    }
  }
  /// False once answered (or for a notification's empty responder).
  explicit operator bool() const noexcept { return static_cast<bool>(fail_); }

private:
  reply_fn reply_;
  fail_fn fail_;
};

/// The message port of one worker. `rpc::agent` implements it over its
/// connections; a test may implement it over a simulated network, so that code
/// written against it (the RRef protocol) runs unchanged in both.
///
/// Thread rules: handlers run on the port's executor; request(), notify() and
/// run_local() may be called from any thread; set_handler(), add_shutdown_step()
/// and set_extension() only before the agent starts.
class message_port {
public:
  /// A handler of one message kind.
  using handler = std::function<void(inbound_message&&, responder&&)>;
  /// A step of graceful shutdown; gets the deadline it must end by (half of
  /// what is left of the shutdown's deadline). Cancellation: a step is
  /// cancelled (terminal) only when the awaiting `agent::async_shutdown` is.
  using shutdown_step = std::function<asio::awaitable<void>(corodist::deadline by)>;

  virtual ~message_port() = default;

  /// This worker.
  virtual const worker_info& self() const = 0;
  /// The number of workers.
  virtual int world_size() const = 0;
  /// A worker by name or rank; throws usage_error if there is none.
  virtual const worker_info& worker(worker_ref w) const = 0;
  /// The executor handlers run on.
  virtual asio::any_io_executor get_executor() = 0;

  /// Handles every message of `kind` with `h`; `name` says what such a
  /// message is, in logs and errors ("rref: control message"). Throws
  /// usage_error for a kind of rpc's own range, a kind already handled, or
  /// after start.
  virtual void set_handler(message_kind kind, std::string name, handler h) = 0;

  /// Sends a request of `kind` to worker `to`; the future holds the reply's
  /// frame payload, or timeout_error (at `by`; the remote handler sees no
  /// deadline: it answers or fails on its own),
  /// connection_error (unreachable, or lost with the request pending),
  /// usage_error (this worker is not running), remote_error (the handler
  /// failed). Every error but remote_error reads `<what>: <reason>`: `what`
  /// names the operation, its object and the worker, as the user knows them
  /// ("to_here of RRef R{0, 1} owned by 'w1'"). Nothing is retried.
  virtual future<net::bytes> request(int to, message_kind kind, payload p, corodist::deadline by,
                                     std::string what) = 0;

  /// Sends a one-way message of `kind` to worker `to`. A failure to deliver is
  /// logged at debug level (naming the kind by its handler's name) and
  /// otherwise silent (a protocol above that needs delivery acknowledges and
  /// retries).
  virtual void notify(int to, message_kind kind, payload p) = 0;

  /// Runs the function registered as `fn` here, on `args` (a msgpack array,
  /// decoded under the current codec_context, kept alive by `keep`), as the
  /// call `ctx` describes; the future holds its encoded result, or its
  /// exception (unknown_function_error, bad_arguments_error, or what it threw).
  virtual future<payload> run_local(std::string_view fn, const msgpack::object& args, std::shared_ptr<const void> keep,
                                    call_context ctx) = 0;

  /// Adds `step` to graceful shutdown: steps run in order after the workers'
  /// join (no user call is in flight anywhere; the connections are still
  /// open), each given half of the time left; every worker ends a step before
  /// any worker goes on to the next (or closes). A step that throws is logged,
  /// the others still run, and shutdown() throws its exception at the end.
  virtual void add_shutdown_step(std::string name, shutdown_step step) = 0;

  /// A codec_context for decoding a message from `from` on this port.
  virtual void decode_context(int from, codec_context& ctx) = 0;

  /// A weak reference to what owns this port's life (an agent's core, which
  /// may outlive the agent object and be destroyed on another thread). An
  /// upper layer that calls into the port from its own threads locks it
  /// first: while locked, the port is not destroyed; once it cannot be locked,
  /// the port is gone (or going). Empty (the default): the port outlives its
  /// users (a simulated one).
  virtual std::weak_ptr<const void> lifetime() const { return {}; }

  /// Attaches an upper layer's per-worker object (found again by its type).
  template <typename T>
  void set_extension(std::shared_ptr<T> ext) {
    extensions_[std::type_index(typeid(T))] = std::move(ext);
  }
  /// The object of type T attached with set_extension, or null.
  template <typename T>
  T* extension() const {
    auto it = extensions_.find(std::type_index(typeid(T)));
    return it == extensions_.end() ? nullptr : static_cast<T*>(it->second.get());
  }

private:
  std::unordered_map<std::type_index, std::shared_ptr<void>> extensions_;
};

} // namespace corodist::rpc
