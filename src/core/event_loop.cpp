#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>

#include "core/io_registry.hpp"
#include "core/linger.hpp"
#include "core/log.hpp"
#if CORODIST_IO_URING
#include "core/ring_setup.hpp"
#endif

#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#if CORODIST_IO_URING
#include <liburing.h>
#endif

namespace corodist {

namespace {

// Live event_loops, for on_loop_thread() and require_running(). Touched only at
// loop construction/destruction and by blocking facades, never on a hot path.
std::mutex registry_mutex;
std::vector<const event_loop*>& registry() {
  static std::vector<const event_loop*> loops;
  return loops;
}

void register_loop(const event_loop* l) {
  std::lock_guard lk(registry_mutex);
  registry().push_back(l);
}

void unregister_loop(const event_loop* l) {
  std::lock_guard lk(registry_mutex);
  auto& r = registry();
  if (auto it = std::find(r.begin(), r.end(), l); it != r.end())
    r.erase(it);
}

[[noreturn]] void throw_io_uring_unavailable(int err, const char* where) {
  std::string why = std::strerror(err);
  std::string hint;
  if (err == EPERM || err == ENOSYS || err == EACCES)
    hint = " The kernel or a sandbox forbids io_uring (e.g. Docker's default seccomp profile, "
           "or sysctl kernel.io_uring_disabled=1/2).";
  else if (err == ENOMEM)
    hint = " The ring could not be allocated (RLIMIT_MEMLOCK too low on older kernels?).";
  throw error(std::string("corodist: io_uring is unavailable (") + where + ": " + why + ")." + hint +
              " Rebuild with `meson setup -Dio_uring=disabled` for the epoll backend.");
}

} // namespace

namespace detail {
bool on_loop_thread() noexcept {
  std::lock_guard lk(registry_mutex);
  for (auto* l : registry())
    if (l->running_in_this_thread())
      return true;
  return false;
}

void require_running(const asio::execution_context& ctx, const char* what) {
  std::lock_guard lk(registry_mutex);
  for (auto* l : registry()) {
    if (&static_cast<const asio::execution_context&>(l->context()) != &ctx)
      continue;
    if ((!l->embedded() && !l->running()) || l->context().stopped())
      throw usage_error(std::string("corodist: ") + what +
                        ": the event loop is not running (call loop.start() first, or run the io_context "
                        "it is embedded in)");
    return;
  }
}
} // namespace detail

std::string_view event_loop::backend() noexcept {
#if CORODIST_IO_URING
  return "io_uring";
#else
  return "epoll";
#endif
}

void event_loop::probe_io_uring() {
#if CORODIST_IO_URING
  io_uring ring;
  if (int rc = io_uring_queue_init(4, &ring, 0); rc < 0)
    throw_io_uring_unavailable(-rc, "io_uring_queue_init");
  io_uring_queue_exit(&ring);
#endif
}

event_loop::event_loop() {
  probe_io_uring();
  try {
#if CORODIST_IO_URING
    // One thread submits to and reaps this ring: it can take the cooperative flags.
    const detail::ring_flags_scope flags(detail::owned_loop_ring_flags());
#endif
    owned_ = std::make_unique<asio::io_context>(1);
#if CORODIST_IO_URING
    // Asio makes the ring lazily, with the first I/O object: make it here, inside the scope.
    asio::steady_timer make_ring(*owned_);
#endif
  } catch (const std::system_error& e) {
    throw_io_uring_unavailable(e.code().value(), "asio::io_context");
  }
  ctx_ = owned_.get();
  register_loop(this);
}

event_loop::event_loop(asio::io_context& ctx) : ctx_(&ctx) { register_loop(this); }

event_loop::~event_loop() {
  const bool on_own_thread = thread_.joinable() && thread_.get_id() == std::this_thread::get_id();
  if (owned_ && thread_.joinable() && !on_own_thread && !ctx_->stopped()) {
    // The handler running now may still hold the last references to objects
    // (a completed call's keep-alive): let it finish, and what it posted run.
    std::promise<void> turn;
    auto done = turn.get_future();
    asio::post(*ctx_, [&turn] { turn.set_value(); });
    done.wait_for(std::chrono::seconds(1));
    // Lingering jobs (a store host waiting for the other ranks to leave) end
    // first, each within the bound it announced.
    if (asio::has_service<detail::linger_service>(*ctx_))
      asio::use_service<detail::linger_service>(*ctx_).wait();
  }
  stop();
  if (on_own_thread)
    thread_.detach(); // destroyed on its own loop thread: cannot join self
  else if (owned_)
    drain();
  unregister_loop(this);
}

void event_loop::drain() noexcept {
  // Close the connections and listeners still open on this context, and run
  // what is ready (their aborted operations, cleanup posted by objects
  // destroyed off the loop), so that coroutine frames end while every Asio
  // service is still alive: frames left for io_context's destructor would be
  // destroyed after the socket services they refer to (Asio issue 1235).
  // Bounded: about 100 ms at most.
  try {
    if (asio::has_service<detail::io_registry>(*ctx_))
      asio::use_service<detail::io_registry>(*ctx_).close_all();
    ctx_->restart();
    ctx_->run_for(std::chrono::milliseconds(100)); // returns as soon as no work is left
  } catch (const std::exception& e) {
    CORODIST_LOG_WARN("event loop drain at destruction: {}", e.what());
  }
}

void event_loop::start() {
  if (!owned_)
    throw usage_error("event_loop::start(): this loop wraps a user's io_context; run that context instead");
  if (thread_.joinable())
    return;
  ctx_->restart();
  thread_ = std::thread([ctx = ctx_] {
    auto guard = asio::make_work_guard(*ctx);
    try {
      ctx->run();
    } catch (const std::exception& e) {
      CORODIST_LOG_ERROR("event loop terminated by an exception: {}", e.what());
      throw;
    }
  });
}

void event_loop::stop() {
  if (!owned_)
    return;
  ctx_->stop();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id())
    thread_.join();
}

} // namespace corodist

namespace corodist::detail {
void throw_blocking_on_loop(const char* what) {
  throw usage_error(std::string("corodist: ") + what +
                    " would block an event-loop thread while the result is not ready, deadlocking it; "
                    "co_await the future (or use then()) on the loop instead");
}
} // namespace corodist::detail
