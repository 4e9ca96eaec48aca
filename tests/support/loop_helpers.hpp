#pragma once
// Helpers shared by the test suites: run a function on an event loop and
// wait for it; blocking transfers on a raw socket; tell whether the peer
// closed a socket.

#include <corodist/core/event_loop.hpp>

#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <future>
#include <string_view>
#include <system_error>
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
/// whether it held. Only for state that no event of the program announces:
/// the kernel's (a socket's queues, a thread's /proc state); everything the
/// program does itself is waited on through an event.
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

/// Writes all of `bytes` to the blocking socket `s`, going on after EINTR: the
/// completion of io_uring work this thread submitted (a post to an event
/// loop's ring) may interrupt a blocking system call of this thread. Throws
/// std::system_error for other errors.
inline void send_all(asio::ip::tcp::socket& s, std::string_view bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    std::error_code ec;
    done += asio::write(s, asio::buffer(bytes.substr(done)), ec);
    if (ec && ec != asio::error::interrupted)
      throw std::system_error(ec, "write");
  }
}

/// Reads exactly `n` bytes from the blocking socket `s` into `data`, going on
/// after EINTR (see send_all). Throws std::system_error for other errors.
inline void receive_all(asio::ip::tcp::socket& s, void* data, std::size_t n) {
  std::size_t done = 0;
  while (done < n) {
    std::error_code ec;
    done += asio::read(s, asio::buffer(static_cast<char*>(data) + done, n - done), ec);
    if (ec && ec != asio::error::interrupted)
      throw std::system_error(ec, "read");
  }
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
