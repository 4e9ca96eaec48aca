#pragma once
/// \file
/// corodist::rpc::agent: remote procedure calls between the workers of a job
/// (the C++ counterpart of torch.distributed.rpc), on the event loop.

#include <corodist/core/event_loop.hpp>
#include <corodist/core/future.hpp>
#include <corodist/rpc/agent_options.hpp>
#include <corodist/rpc/attachment.hpp>
#include <corodist/rpc/detail/codec.hpp>
#include <corodist/rpc/errors.hpp>
#include <corodist/rpc/worker_info.hpp>

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace corodist::rpc {

namespace detail {
class agent_impl;
/// What a call's completion receives: an error, or the reply payload.
struct reply {
  std::exception_ptr error;
  net::bytes payload;
};
using reply_handler = corodist::detail::unique_function<void(reply&&)>;
} // namespace detail

/// An RPC agent: one per worker process (or several per process, each on an
/// event loop). Loop-affine state, thread-safe API:
///
/// * `register_function` before `start()`; plain callables run on the
///   agent's worker pool (they may block), callables returning
///   `asio::awaitable<R>` run on the loop (they must not block).
/// * `rpc_async` / `rpc_sync` / `call` from any thread or coroutine once
///   started. Arguments and results are msgpack-encoded (user structs via
///   msgpack adaptors, e.g. `MSGPACK_DEFINE`); `rpc::attachment` values travel
///   as zero-copy attachments.
/// * Failures: `timeout_error`, `connection_error` (peer unreachable or died
///   with the call pending), `remote_error` (the function threw; carries the
///   worker, type and message), its subclasses `unknown_function_error` and
///   `bad_arguments_error`, `usage_error` (unknown worker, agent not running).
///   Calls are never retried.
///
/// Destroying an agent without shutdown() is safe (it is an immediate
/// shutdown); it waits for running plain functions to return.
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
  /// arguments decode to, and each must be default-constructible. Call before
  /// start(); throws `usage_error` afterwards or for a duplicate name.
  template <typename F>
  void register_function(std::string name, F f) {
    add_handler(std::move(name), detail::make_handler(std::move(f)));
  }

  /// Starts: listens, publishes this worker in the store (a duplicate name or
  /// rank throws `usage_error` naming both ranks), then waits up to
  /// `init_timeout` for all workers (`timeout_error` naming the missing ranks).
  /// Runs on the loop; await from any coroutine.
  [[nodiscard]] asio::awaitable<void> async_start();

  /// Blocking start() for plain threads; throws `usage_error` on a loop thread.
  void start();

  /// Graceful shutdown: stops when no call is in flight on any worker (every
  /// worker must call it; store barriers, each bounded by shutdown_timeout),
  /// then closes every connection. Later calls throw `usage_error`.
  [[nodiscard]] asio::awaitable<void> async_shutdown();
  /// `graceful == false`: immediate — closes at once; pending calls fail with
  /// `connection_error` (here and at the peers).
  [[nodiscard]] asio::awaitable<void> async_shutdown(bool graceful);

  /// Blocking shutdown for plain threads; throws `usage_error` on a loop thread.
  void shutdown(bool graceful = true);

  /// Calls `fn` on worker `to` with `args`; returns at once. The future holds
  /// the result, or one of the errors listed on the class. Any thread.
  template <typename R, typename... A>
  future<R> rpc_async(worker_ref to, std::string_view fn, A&&... args) {
    return rpc_async_impl<R>(std::nullopt, to, fn, args...);
  }

  /// As above with a deadline overriding `rpc_timeout` (zero: none).
  template <typename R, typename... A>
  future<R> rpc_async(call_timeout timeout, worker_ref to, std::string_view fn, A&&... args) {
    return rpc_async_impl<R>(timeout.value, to, fn, args...);
  }

  /// Blocking call from a plain thread; returns the result or throws. Throws
  /// `usage_error` on a loop thread (use `call`).
  template <typename R, typename... A>
  R rpc_sync(worker_ref to, std::string_view fn, A&&... args) {
    refuse_on_loop_thread(); // before sending: the call must not run if we cannot wait for it
    auto f = rpc_async_impl<R>(std::nullopt, to, fn, args...);
    spin_until_ready([&f] { return f.is_ready(); });
    return f.get();
  }

  /// As above with a per-call deadline.
  template <typename R, typename... A>
  R rpc_sync(call_timeout timeout, worker_ref to, std::string_view fn, A&&... args) {
    refuse_on_loop_thread(); // before sending: the call must not run if we cannot wait for it
    auto f = rpc_async_impl<R>(timeout.value, to, fn, args...);
    spin_until_ready([&f] { return f.is_ready(); });
    return f.get();
  }

  /// The call for coroutines: sends at once, `co_await` for the result.
  template <typename R, typename... A>
  [[nodiscard]] asio::awaitable<R> call(worker_ref to, std::string_view fn, A&&... args) {
    return rpc_async_impl<R>(std::nullopt, to, fn, args...).async_get();
  }

  /// As above with a per-call deadline.
  template <typename R, typename... A>
  [[nodiscard]] asio::awaitable<R> call(call_timeout timeout, worker_ref to, std::string_view fn, A&&... args) {
    return rpc_async_impl<R>(timeout.value, to, fn, args...).async_get();
  }

  /// This worker. Valid after start().
  const worker_info& self() const;
  /// A worker by name or rank; throws `usage_error` if there is none. Valid
  /// (and thread-safe) after start().
  const worker_info& get_worker_info(worker_ref w) const;
  /// Every worker, by rank. Valid after start().
  const std::vector<worker_info>& get_worker_infos() const;

  /// The address this agent listens on (after start()).
  asio::ip::tcp::endpoint local_endpoint() const;

  /// Connections this agent dialled that are open (call on the loop; tests).
  std::size_t open_channels() const;

private:
  template <typename R, typename... A>
  future<R> rpc_async_impl(std::optional<std::chrono::milliseconds> timeout, worker_ref to, std::string_view fn,
                           const A&... args) {
    promise<R> p;
    auto f = p.get_future();
    detail::encoded call;
    try {
      call = detail::encode_call(fn, args...);
    } catch (...) {
      p.set_exception(std::current_exception());
      return f;
    }
    start_call(to, fn, std::move(call), timeout, [p = std::move(p)](detail::reply&& r) mutable {
      complete<R>(p, std::move(r));
    });
    return f;
  }

  template <typename R>
  static void complete(promise<R>& p, detail::reply&& r) {
    if (r.error) {
      p.set_exception(std::move(r.error));
      return;
    }
    try {
      if constexpr (std::is_void_v<R>) {
        detail::decode_result<void>(std::move(r.payload), "rpc");
        p.set_value();
      } else {
        p.set_value(detail::decode_result<R>(std::move(r.payload), "rpc"));
      }
    } catch (...) {
      p.set_exception(std::current_exception());
    }
  }

  // Polls `ready` for up to options' sync_spin (not on a loop thread).
  void spin_until_ready(const std::function<bool()>& ready) const;
  /// Throws usage_error on an event-loop thread (rpc_sync would deadlock it).
  static void refuse_on_loop_thread();
  void add_handler(std::string name, detail::handler h);
  void start_call(worker_ref to, std::string_view fn, detail::encoded call,
                  std::optional<std::chrono::milliseconds> timeout, detail::reply_handler done);

  event_loop& loop_;
  std::shared_ptr<detail::agent_impl> impl_;
};

} // namespace corodist::rpc
