// Fuzz target: the store server's PyTorch TCPStore wire parser (1.13 and 2.x:
// query codes, length-prefixed keys and values, key lists, VALIDATE, queues),
// on a real connection. The first byte is kept below 32, where the server
// takes a connection for PyTorch's protocol.
#include <corodist/store/store_server.hpp>

#include "socket_fuzz.hpp"

namespace cs = corodist::store;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto server = [] {
    cs::server_options o;
    o.auth_token = "";
    o.max_key_size = 256;
    o.max_value_size = 4096;
    o.max_keys_per_request = 64;
    o.max_pending_waits = 16;
    o.handshake_timeout = std::chrono::milliseconds(500);
    return cs::store_server::start(corodist::fuzz::context().get_executor(), o);
  }();
  if (size == 0)
    return 0;
  const std::uint8_t first = data[0] % 32;
  corodist::fuzz::send_and_drain(server->local_endpoint(), &first, 1, data + 1, size - 1);
  return 0;
}
