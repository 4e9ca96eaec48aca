#pragma once
// Test helper: a TCP forwarder that adds latency (this kernel has no netem).
// It accepts connections on one endpoint, connects each to a target, and
// forwards the bytes both ways, each chunk held for a fixed delay after it
// was read, in order: a link with added one-way latency, not a slower one
// (reading goes on while earlier chunks wait). What is queued is not bounded:
// for tests, not for bulk transfers that outrun the target.
//
// Runs on an io_context of the caller's, typically in a process on a host
// of a host_bed:
//
//   auto proxy = bed.run(1, [&] {
//     asio::io_context ctx;
//     corodist::test::delay_proxy p(ctx.get_executor(), {asio::ip::make_address(bed.address(1)), 0},
//                                   {asio::ip::make_address(bed.address(2)), port}, 50ms);
//     /* tell the parent p.port() */
//     ctx.run();
//     return 0;
//   });
//
// A connection's two directions end independently: EOF on one side is passed
// on (shutdown of sending) once the chunks before it are delivered; an error
// on either socket closes both.

#include <asio/experimental/as_tuple.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

namespace corodist::test {

/// A TCP forwarder that delays every chunk by a fixed time (see the file comment).
/// Loop-affine: used on the thread that runs its executor.
class delay_proxy {
public:
  /// Listens on `listen` (port 0: the kernel picks) and forwards each
  /// accepted connection to `target`, `delay` late each way. Throws
  /// std::system_error when it cannot listen.
  delay_proxy(asio::any_io_executor ex, asio::ip::tcp::endpoint listen, asio::ip::tcp::endpoint target,
              std::chrono::milliseconds delay)
      : state_(std::make_shared<state>(ex, listen, target, delay)) {
    asio::co_spawn(ex, accept_loop(state_), asio::detached);
  }
  /// Stops accepting; connections in progress go on until they end.
  ~delay_proxy() {
    std::error_code ec;
    state_->acceptor.close(ec);
  }
  delay_proxy(const delay_proxy&) = delete;
  delay_proxy& operator=(const delay_proxy&) = delete;

  /// The port it listens on.
  std::uint16_t port() const { return state_->acceptor.local_endpoint().port(); }

private:
  using tcp = asio::ip::tcp;
  using clock = std::chrono::steady_clock;

  struct state {
    state(asio::any_io_executor ex, tcp::endpoint listen, tcp::endpoint to, std::chrono::milliseconds d)
        : acceptor(ex, listen), target(to), delay(d) {}
    tcp::acceptor acceptor;
    tcp::endpoint target;
    std::chrono::milliseconds delay;
  };

  // One direction of a connection: chunks read from `from`, due at a time,
  // written to `to` by a second coroutine.
  struct pipe {
    pipe(std::shared_ptr<tcp::socket> f, std::shared_ptr<tcp::socket> t)
        : from(std::move(f)), to(std::move(t)), wake(from->get_executor(), clock::time_point::max()) {}
    std::shared_ptr<tcp::socket> from, to;
    std::deque<std::pair<clock::time_point, std::vector<char>>> queue;
    asio::steady_timer wake; // the writer's: at the front chunk's due time, or idle
    bool read_done = false;
    void close_both() {
      std::error_code ec;
      from->close(ec);
      to->close(ec);
    }
  };

  static asio::awaitable<void> accept_loop(std::shared_ptr<state> s) {
    for (;;) {
      auto [ec, in] = co_await s->acceptor.async_accept(asio::experimental::as_tuple(asio::use_awaitable));
      if (ec == asio::error::operation_aborted || !s->acceptor.is_open())
        co_return;
      if (ec)
        continue;
      asio::co_spawn(s->acceptor.get_executor(), session(s, std::move(in)), asio::detached);
    }
  }

  static asio::awaitable<void> session(std::shared_ptr<state> s, tcp::socket in) {
    auto a = std::make_shared<tcp::socket>(std::move(in));
    auto b = std::make_shared<tcp::socket>(a->get_executor());
    auto [ec] = co_await b->async_connect(s->target, asio::experimental::as_tuple(asio::use_awaitable));
    if (ec)
      co_return; // the client sees its connection closed
    for (auto [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
      auto p = std::make_shared<pipe>(from, to);
      asio::co_spawn(a->get_executor(), reader(p, s->delay), asio::detached);
      asio::co_spawn(a->get_executor(), writer(p), asio::detached);
    }
  }

  static asio::awaitable<void> reader(std::shared_ptr<pipe> p, std::chrono::milliseconds delay) {
    for (;;) {
      std::vector<char> chunk(64 * 1024);
      auto [ec, n] = co_await p->from->async_read_some(asio::buffer(chunk), asio::experimental::as_tuple(asio::use_awaitable));
      if (ec) {
        p->read_done = true;
        if (ec != asio::error::eof)
          p->close_both();
        p->wake.cancel();
        co_return;
      }
      chunk.resize(n);
      p->queue.emplace_back(clock::now() + delay, std::move(chunk));
      if (p->queue.size() == 1)
        p->wake.cancel(); // the writer waits idle: the front chunk changed
    }
  }

  static asio::awaitable<void> writer(std::shared_ptr<pipe> p) {
    for (;;) {
      if (p->queue.empty()) {
        if (p->read_done) {
          std::error_code ec;
          p->to->shutdown(tcp::socket::shutdown_send, ec); // EOF passed on
          co_return;
        }
        p->wake.expires_at(clock::time_point::max());
        (void)co_await p->wake.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        continue;
      }
      if (clock::now() < p->queue.front().first) {
        p->wake.expires_at(p->queue.front().first);
        (void)co_await p->wake.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        continue;
      }
      auto chunk = std::move(p->queue.front().second);
      p->queue.pop_front();
      auto [ec, n] = co_await asio::async_write(*p->to, asio::buffer(chunk), asio::experimental::as_tuple(asio::use_awaitable));
      if (ec) {
        p->close_both();
        co_return;
      }
    }
  }

  std::shared_ptr<state> state_;
};

} // namespace corodist::test
