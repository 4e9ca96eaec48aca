#pragma once
// Helpers shared by the test suites: run a function on an event loop and
// wait for it; tell whether the peer closed a socket.

#include <corodist/core/event_loop.hpp>

#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <future>
#include <thread>
#include <poll.h>
#include <sys/socket.h>

namespace corodist::test {

/// Runs `f` on `loop` and returns its result; fails the test after 10 s.
template <typename F>
auto on_loop(event_loop& loop, F f) {
  std::promise<decltype(f())> p;
  auto fut = p.get_future();
  asio::post(loop.get_executor(), [&] {
    if constexpr (std::is_void_v<decltype(f())>) {
      f();
      p.set_value();
    } else {
      p.set_value(f());
    }
  });
  BOOST_REQUIRE(fut.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  return fut.get();
}

/// Polls `pred` (every millisecond) until it holds or `limit` passes; returns
/// whether it held. For state another thread changes with no event to wait on.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// True when the peer has closed `s` (EOF or reset) within `limit`.
inline bool closed_by_peer(asio::ip::tcp::socket& s, std::chrono::milliseconds limit = std::chrono::seconds(3)) {
  char buf[256];
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{s.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0)
      continue;
    ssize_t n = ::recv(s.native_handle(), buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno == ECONNRESET))
      return true;
  }
  return false;
}

} // namespace corodist::test
