// Fuzz target: the client side of the hello -- the server's hello, its
// extension (nonce and proof of the mutual authentication) and the verdict
// byte, as a hostile server sends them, to a client that holds a token.
#include <corodist/net/connection.hpp>

#include "socket_fuzz.hpp"

#include <asio/co_spawn.hpp>
#include <asio/use_awaitable.hpp>

namespace net = corodist::net;

namespace {
asio::awaitable<void> connect_once(asio::ip::tcp::endpoint ep, net::connection_options o) {
  auto [ec, conn] = co_await net::connection::connect(corodist::fuzz::context().get_executor(), ep, o);
  if (conn)
    conn->close();
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto& ctx = corodist::fuzz::context();
  static asio::ip::tcp::acceptor acceptor(ctx, {asio::ip::make_address("127.0.0.1"), 0});
  net::connection_options o;
  o.auth_token = "fuzz token";
  o.handshake_timeout = std::chrono::milliseconds(500);
  bool done = false;
  asio::co_spawn(ctx, connect_once(acceptor.local_endpoint(), o), [&](std::exception_ptr) { done = true; });
  ctx.restart();
  ctx.poll(); // starts the connect; the kernel completes it into the backlog
  asio::ip::tcp::socket server(ctx);
  std::error_code ec;
  acceptor.accept(server, ec);
  if (!ec) {
    asio::write(server, asio::buffer(data, size), ec);
    server.shutdown(asio::socket_base::shutdown_send, ec);
  }
  corodist::fuzz::run_until([&] { return done; });
  server.close(ec);
  return 0;
}
