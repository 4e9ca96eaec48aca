#pragma once
// For the fuzz targets that feed bytes to a real server over loopback: one
// io_context for the whole run, a client that sends an input and half-closes,
// and a bounded wait for the server to end that connection.
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/write.hpp>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <sys/socket.h>

namespace corodist::fuzz {

/// The io_context every server and client of a fuzz run lives on (this thread runs it).
inline asio::io_context& context() {
  static asio::io_context* ctx = [] {
    std::signal(SIGPIPE, SIG_IGN);
    return new asio::io_context(1);
  }();
  return *ctx;
}

/// Runs the context until `done()` or `limit` passes (bounded time per input).
template <typename Done>
void run_until(Done done, std::chrono::milliseconds limit = std::chrono::milliseconds(2000)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    context().restart();
    context().run_for(std::chrono::milliseconds(1));
  }
}

/// Connects to `ep`, sends `prefix` then the input, half-closes, and serves the
/// context until the server has closed the connection (or the time limit).
inline void send_and_drain(const asio::ip::tcp::endpoint& ep, const void* prefix, std::size_t prefix_size,
                           const std::uint8_t* data, std::size_t size) {
  asio::ip::tcp::socket s(context());
  std::error_code ec;
  s.connect(ep, ec);
  if (ec)
    return;
  s.non_blocking(true, ec);
  // Write while serving the context, so a server that reads as it goes is never stuck.
  auto write_some = [&](const void* p, std::size_t n) {
    std::size_t sent = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(2000);
    while (sent < n && std::chrono::steady_clock::now() < deadline) {
      const ssize_t k = ::send(s.native_handle(), static_cast<const char*>(p) + sent, n - sent, MSG_NOSIGNAL);
      if (k > 0)
        sent += static_cast<std::size_t>(k);
      else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
        return false;
      context().restart();
      context().poll();
    }
    return sent == n;
  };
  if (write_some(prefix, prefix_size) && write_some(data, size))
    s.shutdown(asio::socket_base::shutdown_send, ec);
  bool closed = false;
  run_until([&] {
    char buf[4096];
    const ssize_t k = ::recv(s.native_handle(), buf, sizeof buf, MSG_DONTWAIT);
    closed = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    return closed;
  });
  s.close(ec);
  context().restart();
  context().poll();
}

} // namespace corodist::fuzz
