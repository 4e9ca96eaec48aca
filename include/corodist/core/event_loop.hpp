#pragma once
/// \file
/// corodist::event_loop: the io_context every loop-affine object runs on.

#include <corodist/core/config.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/io_context.hpp>

#include <memory>
#include <string_view>
#include <thread>

namespace corodist {

/// An io_uring-backed `asio::io_context`, either owned and run on a thread of
/// its own (`start()` / `stop()`) or borrowed from a server that runs its
/// context itself (embedded mode).
///
/// Loop-affine objects (connections, store server, RPC agent) touch their
/// state only on the loop's thread; other threads post to `get_executor()`.
/// Blocking facades (`future::get()` etc.) throw `usage_error` when called on
/// a loop thread instead of deadlocking.
class event_loop {
public:
  using executor_type = asio::io_context::executor_type;

  /// Creates an owned io_context on the build's reactor (io_uring by default).
  /// Throws `corodist::error` naming the cause and `-Dio_uring=disabled` if the
  /// kernel or a sandbox forbids io_uring.
  event_loop();

  /// Embedded mode: wraps `ctx`, which the caller runs (and must outlive this).
  explicit event_loop(asio::io_context& ctx);

  /// Stops and joins the loop thread (owned mode, if started), then runs the
  /// handlers that are ready (cleanup posted by objects destroyed off the
  /// loop), for at most ~100 ms, before destroying the context.
  ~event_loop();

  event_loop(const event_loop&) = delete;
  event_loop& operator=(const event_loop&) = delete;

  /// Runs the context on a new thread until `stop()`. Idempotent while running.
  /// Throws `usage_error` in embedded mode.
  void start();

  /// Stops the context and joins the loop thread; pending handlers are not run.
  /// Safe to call repeatedly, and from any thread except the loop's own
  /// (there it only requests the stop). No-op in embedded mode.
  void stop();

  /// True between `start()` and `stop()` (owned mode).
  bool running() const noexcept { return thread_.joinable(); }

  /// True in embedded mode (the context is the user's, run by the user).
  bool embedded() const noexcept { return owned_ == nullptr; }

  /// Returns the io_context (owned or borrowed).
  asio::io_context& context() noexcept { return *ctx_; }
  const asio::io_context& context() const noexcept { return *ctx_; }

  /// Returns the context's executor.
  executor_type get_executor() noexcept { return ctx_->get_executor(); }

  /// True when the calling thread is running this loop's context.
  bool running_in_this_thread() const noexcept { return ctx_->get_executor().running_in_this_thread(); }

  /// Returns "io_uring" or "epoll": the reactor this build uses.
  static std::string_view backend() noexcept;

  /// Checks that io_uring can be used here; throws `corodist::error` with the
  /// reason and the remedy if not. A no-op in the epoll build.
  static void probe_io_uring();

private:
  void drain() noexcept;

  std::unique_ptr<asio::io_context> owned_;
  asio::io_context* ctx_;
  std::thread thread_;
};

namespace detail {
/// True if the calling thread is running the context of any live event_loop.
bool on_loop_thread() noexcept;
/// Throws usage_error naming `what` if `ctx` belongs to a live event_loop that
/// is not running (owned and not started, or stopped); otherwise returns.
void require_running(const asio::execution_context& ctx, const char* what);
} // namespace detail

} // namespace corodist
