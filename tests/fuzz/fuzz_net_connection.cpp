// Fuzz target: the server side of net/ -- the hello (magic, version, flags,
// extension) and the frame reader (headers, split reads, large frames that
// grow as they arrive), on a real connection over loopback; requests are echoed.
#include <corodist/net/connection.hpp>
#include <corodist/net/listener.hpp>

#include "socket_fuzz.hpp"

namespace net = corodist::net;

namespace {
const asio::ip::tcp::endpoint& server() {
  static const asio::ip::tcp::endpoint ep = [] {
    net::connection_options o;
    o.max_frame_size = 1 << 20;
    o.handshake_timeout = std::chrono::milliseconds(500);
    o.frame_timeout = std::chrono::milliseconds(500);
    auto [ec, l] = net::listener::listen(corodist::fuzz::context().get_executor(),
                                         {asio::ip::make_address("127.0.0.1"), 0}, o,
                                         [](std::shared_ptr<net::connection> c) {
                                           c->start([](const std::shared_ptr<net::connection>& conn, net::message&& m) {
                                             if (!(m.header.flags & net::frame_flags::one_way))
                                               conn->respond(m.header.request_id, m.header.kind, std::move(m.payload));
                                           });
                                         });
    if (ec)
      std::abort();
    l->start();
    static auto keep = l;
    return l->local_endpoint();
  }();
  return ep;
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  corodist::fuzz::send_and_drain(server(), nullptr, 0, data, size);
  return 0;
}
