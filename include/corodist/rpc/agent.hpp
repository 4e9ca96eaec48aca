#pragma once
/// \file
/// corodist::rpc::agent: remote procedure calls between the workers of a job
/// (the C++ counterpart of torch.distributed.rpc), on the event loop.

#include <corodist/core/config.hpp>

#include <corodist/core/event_loop.hpp>
#include <corodist/core/future.hpp>
#include <corodist/core/unique_function.hpp>
#include <corodist/rpc/agent_options.hpp>
#include <corodist/rpc/attachment.hpp>
#include <corodist/rpc/bidi_stream.hpp>
#include <corodist/rpc/call_context.hpp>
#include <corodist/rpc/call_options.hpp>
#include <corodist/rpc/codec.hpp>
#include <corodist/rpc/decode_result.hpp>
#include <corodist/rpc/detail/call_wait.hpp>
#include <corodist/rpc/detail/codec.hpp>
#include <corodist/rpc/detail/stream_function.hpp>
#include <corodist/rpc/errors.hpp>
#include <corodist/rpc/message_port.hpp>
#include <corodist/rpc/stream_options.hpp>
#include <corodist/rpc/stream_reader.hpp>
#include <corodist/rpc/stream_writer.hpp>
#include <corodist/rpc/worker_info.hpp>

#include <asio/awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace corodist::rpc {

namespace detail {
class agent_core;
struct outgoing_call;
} // namespace detail

/// An RPC agent: one per worker process (or several per process, each on an
/// event loop). Loop-affine state, thread-safe API:
///
/// * `register_function` before `start()`; plain callables run on the
///   agent's worker pool (they may block), callables returning
///   `asio::awaitable<R>` run on the loop (they must not block). A first
///   parameter `const rpc::call_context&` receives the caller and its deadline.
/// * `rpc_async` / `rpc_sync` / `call` from any thread or coroutine once
///   started. Arguments and results are msgpack-encoded (user structs via
///   msgpack adaptors, e.g. `MSGPACK_DEFINE`); `rpc::attachment` values travel
///   as zero-copy attachments.
/// * The caller's deadline travels with the call: the callee does not start a
///   call whose deadline has passed, and cancels a coroutine function at it.
///   Calls made while serving a call (from a registered function, plain or
///   coroutine) propagate its deadline as gRPC does: theirs is the earlier of
///   their own and the served call's (`call_options::propagate_deadline`).
/// * Cancellation reaches the callee: `future::cancel()` on an `rpc_async`
///   future, or cancelling the coroutine awaiting `call`, fails the call with
///   `cancelled_error` at once and sends a cancel; the callee's coroutine
///   function is cancelled (its pending operation ends with
///   `operation_aborted`), a plain function sees `call_context::cancelled()`.
///   Calls such a coroutine function awaits are cancelled in turn.
/// * `call_options` add metadata headers (`call_context::metadata()`).
/// * Failures: `timeout_error`, `connection_error` (peer unreachable or died
///   with the call pending), `cancelled_error` (cancelled by this caller), `remote_error` (the function threw; carries the
///   worker, type and message), its subclasses `unknown_function_error` and
///   `bad_arguments_error`, `bad_result_error` (the result does not decode to
///   R), `usage_error` (unknown worker, agent not running). Calls are never
///   retried.
/// * `port()`: the message port layers above rpc/ build on (rref/).
///
/// Destroying an agent without shutdown() is safe (it is an immediate
/// shutdown, and never throws); it waits for running plain functions to return.
class agent {
public:
  /// Creates an agent on `loop` (owned and started, or embedded). Nothing
  /// happens on the network until start(). Throws `usage_error` for
  /// inconsistent options (no name, no store and no init_method, ...).
  agent(event_loop& loop, agent_options opts);
  ~agent();
  agent(const agent&) = delete;
  agent& operator=(const agent&) = delete;

  /// Registers `f` under `name`; the parameter types (decayed) are what the
  /// arguments decode to, and each must be default-constructible and own its
  /// data (a `std::string_view` or `std::span` parameter does not compile).
  /// Call before start(); throws `usage_error` afterwards or for a duplicate name.
  template <typename F>
  void register_function(std::string name, F f) {
    add_function(std::move(name), detail::make_handler(std::move(f)));
  }

  /// Registers stream function `f` under `name` (before start(); throws
  /// `usage_error` afterwards or for a duplicate name). `f` is a coroutine
  /// returning `asio::awaitable<void>` that runs on the loop, with parameters
  /// `([const call_context&,] stream_writer<T>&, args...)` -- a server stream
  /// of T, opened with open_stream<T> -- or `([const call_context&,]
  /// stream_reader<In>&, stream_writer<Out>&, args...)` -- a bidirectional
  /// stream, opened with open_bidi<In, Out>. Its return ends the stream (the
  /// reader gets nullopt after the items); an exception it throws reaches the
  /// reader as remote_error after the items. It is cancelled (its pending
  /// operation ends with `operation_aborted`, its writer's next write throws
  /// cancelled_error or timeout_error) when the client cancels, at the
  /// stream's deadline, when the client's connection closes, and when the
  /// agent shuts down. Arguments: as register_function's.
  template <typename F>
  void register_stream(std::string name, F f) {
    add_stream_function(std::move(name), detail::make_stream_function(std::move(f)));
  }

  /// Opens a server stream of T from stream function `fn` on worker `to`
  /// with `args`, and returns its reader at once (the open travels meanwhile;
  /// a failed open -- unknown function, bad arguments, unreachable peer --
  /// is the reader's first error). The stream's deadline is `rpc_timeout`
  /// from now. Throws `usage_error` for an unknown worker or an agent not
  /// running, and what encoding `args` throws. Any thread.
  template <typename T, typename... A>
  stream_reader<T> open_stream(worker_ref to, std::string_view fn, A&&... args) {
    return open_stream<T>(stream_options{}, to, fn, args...);
  }
  /// As above within `limit` (`never()`: no deadline).
  template <typename T, typename... A>
  stream_reader<T> open_stream(corodist::timeout limit, worker_ref to, std::string_view fn, A&&... args) {
    stream_options o;
    o.timeout = limit;
    return open_stream<T>(o, to, fn, args...);
  }
  /// As above with options (deadline, metadata).
  template <typename T, typename... A>
  stream_reader<T> open_stream(const stream_options& o, worker_ref to, std::string_view fn, A&&... args) {
    return stream_reader<T>(open_impl<T>(o, to, fn, detail::stream_mode::server, args...));
  }

  /// Opens a bidirectional stream with stream function `fn` on worker `to`:
  /// this side writes W and reads R (the function reads W and writes R).
  /// Returns at once, as open_stream; writes wait for the function's window,
  /// which comes with the open's reply.
  template <typename W, typename R, typename... A>
  bidi_stream<W, R> open_bidi(worker_ref to, std::string_view fn, A&&... args) {
    return open_bidi<W, R>(stream_options{}, to, fn, args...);
  }
  /// As above within `limit`.
  template <typename W, typename R, typename... A>
  bidi_stream<W, R> open_bidi(corodist::timeout limit, worker_ref to, std::string_view fn, A&&... args) {
    stream_options o;
    o.timeout = limit;
    return open_bidi<W, R>(o, to, fn, args...);
  }
  /// As above with options.
  template <typename W, typename R, typename... A>
  bidi_stream<W, R> open_bidi(const stream_options& o, worker_ref to, std::string_view fn, A&&... args) {
    return bidi_stream<W, R>(open_impl<R>(o, to, fn, detail::stream_mode::bidi, args...));
  }

  /// Streams open on this agent, as client or server (any thread; tests and diagnostics).
  std::size_t open_streams() const noexcept;

  /// Starts: listens, publishes this worker in the store (a duplicate name or
  /// rank throws `usage_error` naming both ranks), then waits up to
  /// `init_timeout` for all workers (`timeout_error` naming the missing ranks).
  /// Runs on the loop; await from any coroutine.
  /// Cancellation: terminal (it runs in a coroutine of its own on the loop,
  /// which passes terminal only): ends with `operation_aborted` at the
  /// rendezvous or store wait under way; the agent is then closed (as after a
  /// failed start: later calls throw `usage_error`), and what it published in
  /// the store (its worker entry) stays there.
  [[nodiscard]] asio::awaitable<void> async_start();

  /// Blocking start() for plain threads; throws `usage_error` on a loop thread
  /// or when the loop is not running.
  void start();

  /// Graceful shutdown, within one deadline (`shutdown_timeout` from the
  /// call): waits until no call is in flight on any worker (every worker must
  /// call it; store barriers), then runs the upper layers' shutdown steps
  /// (every worker ends each before any goes on), then closes every
  /// connection. Throws `timeout_error` when the deadline passed first (own
  /// calls still in flight, or a worker that did not join, finish a step or
  /// leave in time: the message says which), `connection_error` or
  /// `store_error` when the store failed, a step's own exception after the rest
  /// has finished; the agent is closed in every case, and later calls throw
  /// `usage_error`. A later shutdown() (while one runs or after it ended,
  /// graceful or not) shares the first one's outcome: it returns or rethrows.
  /// Throws `usage_error` while start() is running (nothing is closed then).
  /// Cancellation: terminal (as async_start): the wait under way (for idle
  /// workers, a step, a barrier) ends, the agent closes at once as an
  /// immediate shutdown does, and the shutdown ends with `operation_aborted`
  /// (also for later shutdown calls, which share its outcome); the other
  /// workers' graceful shutdown does not see this one finish (theirs fails
  /// at their deadline or with the lost connection).
  [[nodiscard]] asio::awaitable<void> async_shutdown();
  /// `graceful == false`: immediate — closes at once; pending calls fail with
  /// `connection_error` (here and at the peers); running coroutine functions
  /// are cancelled. Throws only `usage_error` (as above), or a failed earlier
  /// shutdown's exception. Cancellation: as above (an immediate shutdown does
  /// not wait: it completes before a cancellation could matter).
  [[nodiscard]] asio::awaitable<void> async_shutdown(bool graceful);

  /// Blocking shutdown for plain threads (throws as async_shutdown); throws
  /// `usage_error` on a loop thread.
  void shutdown(bool graceful = true);

  /// Calls `fn` on worker `to` with `args`; returns at once. The future holds
  /// the result, or one of the errors listed on the class. The call's
  /// deadline is `rpc_timeout` from now (and no later than the deadline of
  /// the call being served, when made from a registered function). Any thread.
  /// Cancellation: `cancel()` on the future (any thread) fails it with
  /// `cancelled_error` once the loop has seen it (soon) and sends a cancel to
  /// the callee (unless the call already ended; a call still waiting for its
  /// connection is not sent); a result already on its way is dropped.
  template <typename R, typename... A>
  future<R> rpc_async(worker_ref to, std::string_view fn, A&&... args) {
    return rpc_async_impl<R>(corodist::timeout::inherit(), true, nullptr, true, to, fn, args...);
  }

  /// As above within `limit` (`inherit()`: `rpc_timeout`; `never()`: no
  /// deadline): `rpc.rpc_async<int>(500ms, "w1", "f")`.
  template <typename R, typename... A>
  future<R> rpc_async(corodist::timeout limit, worker_ref to, std::string_view fn, A&&... args) {
    return rpc_async_impl<R>(limit, true, nullptr, true, to, fn, args...);
  }

  /// As above with `opts` (time limit, deadline propagation, metadata);
  /// throws nothing: metadata over `max_metadata_bytes` fails the future
  /// with `usage_error`.
  template <typename R, typename... A>
  future<R> rpc_async(const call_options& opts, worker_ref to, std::string_view fn, A&&... args) {
    return rpc_async_impl<R>(opts.timeout, opts.propagate_deadline, &opts.metadata, true, to, fn, args...);
  }

  /// Blocking call from a plain thread; returns the result or throws. Throws
  /// `usage_error` on a loop thread (use `call`).
  template <typename R, typename... A>
  R rpc_sync(worker_ref to, std::string_view fn, A&&... args) {
    return rpc_sync_impl<R>(corodist::timeout::inherit(), true, nullptr, to, fn, args...);
  }

  /// As above within `limit`.
  template <typename R, typename... A>
  R rpc_sync(corodist::timeout limit, worker_ref to, std::string_view fn, A&&... args) {
    return rpc_sync_impl<R>(limit, true, nullptr, to, fn, args...);
  }

  /// As above with `opts`.
  template <typename R, typename... A>
  R rpc_sync(const call_options& opts, worker_ref to, std::string_view fn, A&&... args) {
    return rpc_sync_impl<R>(opts.timeout, opts.propagate_deadline, &opts.metadata, to, fn, args...);
  }

  /// The call for coroutines: sends at once, `co_await` for the result.
  /// Cancellation: terminal, partial and total through the awaiting
  /// coroutine's cancellation slot: the await ends at once with
  /// `cancelled_error` (a `std::system_error` with `operation_aborted`), and
  /// a cancel goes to the callee, which cancels a coroutine function and
  /// tells a plain one (`call_context::cancelled()`); a result already on its
  /// way is dropped. The connection and other calls go on.
  template <typename R, typename... A>
  [[nodiscard]] asio::awaitable<R> call(worker_ref to, std::string_view fn, A&&... args) {
    return call_impl<R>(corodist::timeout::inherit(), true, nullptr, to, fn, args...);
  }

  /// As above within `limit`. Cancellation: as above.
  template <typename R, typename... A>
  [[nodiscard]] asio::awaitable<R> call(corodist::timeout limit, worker_ref to, std::string_view fn, A&&... args) {
    return call_impl<R>(limit, true, nullptr, to, fn, args...);
  }

  /// As above with `opts` (time limit, deadline propagation, metadata).
  /// Cancellation: as above.
  template <typename R, typename... A>
  [[nodiscard]] asio::awaitable<R> call(const call_options& opts, worker_ref to, std::string_view fn, A&&... args) {
    return call_impl<R>(opts.timeout, opts.propagate_deadline, &opts.metadata, to, fn, args...);
  }

  /// This worker. Throws `usage_error` before start(). Any thread.
  const worker_info& self() const;
  /// A worker by name or rank; throws `usage_error` if there is none or before
  /// start(). Any thread.
  const worker_info& get_worker_info(worker_ref w) const;
  /// Every worker, by rank. Throws `usage_error` before start(). Any thread.
  const std::vector<worker_info>& get_worker_infos() const;

  /// The address this agent listens on (after start()).
  asio::ip::tcp::endpoint local_endpoint() const;

  /// Peers this agent has dialled and holds an open connection to (call on
  /// the loop; tests and diagnostics).
  std::size_t connected_peers() const;

  /// The agent's message port: handlers for upper layers' message kinds,
  /// requests and notifications to workers, shutdown steps. Valid for the
  /// agent's lifetime.
  message_port& port() noexcept;

private:
  template <typename R, typename... A>
  std::shared_ptr<detail::stream_core> open_impl(const stream_options& o, worker_ref to, std::string_view fn,
                                                 detail::stream_mode mode, const A&... args) {
    const int rank = rank_of(to);
    if (!o.metadata.empty())
      check_metadata(o.metadata, fn);
    auto by = o.timeout.or_else(default_timeout()).from();
    if (const auto* served = detail::current_call()) // deadline propagation, as for calls
      by = earliest(by, served->deadline);
    auto core = make_stream(rank, fn, mode);
    core->set_inbox(std::make_unique<detail::typed_inbox<R>>());
    std::size_t items = 0, bytes = 0;
    stream_window(items, bytes);
    encoder e(&port(), self_rank(), rank);
    auto open = detail::encode_stream_open(e, core->id(), fn, by, mode, items, bytes, o.metadata, args...);
    launch_stream(core, std::move(open), by);
    return core;
  }
  std::shared_ptr<detail::stream_core> make_stream(int rank, std::string_view fn, detail::stream_mode mode);
  void stream_window(std::size_t& items, std::size_t& bytes) const noexcept;
  void launch_stream(std::shared_ptr<detail::stream_core> core, payload open, corodist::deadline by);
  void add_stream_function(std::string name, detail::stream_function f);

  // The call's deadline, rank and encoded message into `by`, `rank` and
  // `call`; false, with the error set on `sink` (a promise<R> or a
  // call_wait_setter<R>), when the call cannot be sent (an unknown worker,
  // metadata over its limit, an argument that does not encode).
  template <typename Sink, typename... A>
  bool prepare_call(Sink& sink, corodist::timeout limit, bool propagate, const call_metadata* metadata,
                    worker_ref to, std::string_view fn, payload& call, corodist::deadline& by, int& rank,
                    const A&... args) {
    try {
      by = limit.or_else(default_timeout()).from();
      if (propagate)
        if (const auto* served = detail::current_call())
          by = earliest(by, served->deadline);
      rank = rank_of(to);
      if (metadata && !metadata->empty())
        check_metadata(*metadata, fn);
      encoder e(&port(), self_rank(), rank);
      call = detail::encode_call_with_metadata(e, fn, by, metadata, args...);
      return true;
    } catch (...) {
      sink.set_exception(std::current_exception());
      return false;
    }
  }

  // `propagate`: the deadline is no later than the served call's (if any).
  // `metadata`: null or empty: none. `cancellable`: the call can be cancelled
  // through the future's cancel() (rpc_sync's cannot: not set up).
  template <typename R, typename... A>
  future<R> rpc_async_impl(corodist::timeout limit, bool propagate, const call_metadata* metadata, bool cancellable,
                           worker_ref to, std::string_view fn, const A&... args) {
    promise<R> p;
    auto f = p.get_future();
    payload call;
    int rank = -1;
    corodist::deadline by;
    if (!prepare_call(p, limit, propagate, metadata, to, fn, call, by, rank, args...))
      return f;
    std::shared_ptr<detail::outgoing_call> handle;
    if (cancellable) {
      handle = make_outgoing_call();
      p.set_canceller([handle] { cancel_call(handle); });
    }
    // The completion runs inside the agent's machinery, which keeps the port alive.
    send_call(rank, fn, std::move(call), by,
              [port = &port(), p = std::move(p), rank, fn = std::string(fn)](std::exception_ptr error,
                                                                              net::bytes&& reply) mutable {
                complete<R>(*port, p, std::move(error), std::move(reply), rank, fn);
              },
              std::move(handle));
    return f;
  }

  // call(): sent at once; the returned awaitable waits for the outcome, or at
  // the awaiting coroutine's cancellation cancels the call.
  template <typename R, typename... A>
  asio::awaitable<R> call_impl(corodist::timeout limit, bool propagate, const call_metadata* metadata,
                               worker_ref to, std::string_view fn, const A&... args) {
    auto w = std::make_shared<detail::call_wait<R>>();
    detail::call_wait_setter<R> setter(w);
    payload call;
    int rank = -1;
    corodist::deadline by;
    if (!prepare_call(setter, limit, propagate, metadata, to, fn, call, by, rank, args...))
      return detail::call_wait<R>::wait(std::move(w), {});
    w->fn.assign(fn);
    auto handle = make_outgoing_call();
    send_call(rank, fn, std::move(call), by,
              [port = &port(), setter = std::move(setter), rank](std::exception_ptr error, net::bytes&& reply) mutable {
                complete<R>(*port, setter, std::move(error), std::move(reply), rank, setter.fn());
              },
              handle);
    return detail::call_wait<R>::wait(std::move(w), [handle] { cancel_call(handle); });
  }

  template <typename R, typename... A>
  R rpc_sync_impl(corodist::timeout limit, bool propagate, const call_metadata* metadata, worker_ref to,
                  std::string_view fn, const A&... args) {
    refuse_on_loop_thread(); // before sending: the call must not run if we cannot wait for it
    auto f = rpc_async_impl<R>(limit, propagate, metadata, false, to, fn, args...);
    spin_until_ready([&f] { return f.is_ready(); });
    return f.get();
  }

  // Decodes a reply into `p` (a promise<R> or a call_wait_setter<R>).
  template <typename R, typename Sink>
  static void complete(message_port& port, Sink& p, std::exception_ptr error, net::bytes&& reply, int rank,
                       const std::string& fn) {
    if (error) {
      p.set_exception(std::move(error));
      return;
    }
    try {
      if constexpr (std::is_void_v<R>) {
        decode_result<R>(port, rank, std::move(reply), "rpc '" + fn + "'");
        p.set_value();
      } else {
        p.set_value(decode_result<R>(port, rank, std::move(reply), "rpc '" + fn + "'"));
      }
    } catch (...) {
      p.set_exception(std::current_exception());
    }
  }

  // Polls `ready` for up to options' sync_spin (not on a loop thread).
  void spin_until_ready(const std::function<bool()>& ready) const;
  /// Throws usage_error on an event-loop thread (rpc_sync would deadlock it).
  static void refuse_on_loop_thread();
  void add_function(std::string name, detail::handler h);
  int rank_of(worker_ref to) const;
  int self_rank() const;
  corodist::timeout default_timeout() const noexcept;
  /// What a call's sender gets back, once: the error, or the reply payload.
  using completion = corodist::unique_function<void(std::exception_ptr error, net::bytes&& reply)>;
  /// `cancel`: the handle future::cancel() reaches the call through (null: none).
  void send_call(int rank, std::string_view fn, payload call, corodist::deadline by, completion done,
                 std::shared_ptr<detail::outgoing_call> cancel = nullptr);
  /// A handle for one cancellable call, for send_call.
  std::shared_ptr<detail::outgoing_call> make_outgoing_call() const;
  /// Cancels the call of `handle` (any thread; see rpc_async).
  static void cancel_call(const std::shared_ptr<detail::outgoing_call>& handle);
  /// Throws usage_error if `metadata` is over max_metadata_bytes.
  static void check_metadata(const call_metadata& metadata, std::string_view fn);

  event_loop& loop_;
  std::shared_ptr<detail::agent_core> impl_;
};

} // namespace corodist::rpc
