// Fuzz target: the store server's native protocol -- request frames (the store
// codec: strings, key lists, integers, operation codes) after a valid hello, on
// a real connection, against small limits.
#include <corodist/net/frame.hpp>
#include <corodist/store/store_server.hpp>

#include "socket_fuzz.hpp"

namespace cs = corodist::store;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto server = [] {
    cs::server_options o;
    o.auth_token = "";
    o.torch_protocol = false;
    o.max_key_size = 256;
    o.max_value_size = 4096;
    o.max_keys_per_request = 64;
    o.max_pending_waits = 16;
    o.handshake_timeout = std::chrono::milliseconds(500);
    return cs::store_server::start(corodist::fuzz::context().get_executor(), o);
  }();
  static const auto hello = corodist::net::encode(corodist::net::hello{});
  corodist::fuzz::send_and_drain(server->local_endpoint(), hello.data(), hello.size(), data, size);
  return 0;
}
