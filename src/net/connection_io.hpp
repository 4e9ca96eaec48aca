#pragma once
// What a connection keeps for its transport that its public header does not
// show: the memory of its posted read (sized to Asio's receive operation) and
// the socket's place on a liburing ring.
#include <corodist/net/connection.hpp>

#include <cstddef>
#include <cstdint>

namespace corodist::net {

// Memory for the read that stays posted while the connection is idle (one at
// a time), so that it costs no heap block of its own and never inherits a
// larger recycled one (reader.cpp). Asio 1.22's io_uring receive operation
// with that read's handler is 328 bytes; a larger one goes to the heap.
struct connection::read_op_memory {
  static constexpr std::size_t size = 336;
  alignas(std::max_align_t) std::byte storage[size];
  bool in_use = false;
};

struct connection::io_state {
  read_op_memory read_memory;
  // The socket's place in the loop's uring_service (its uring_file) while
  // the connection is on the ring (options' io = transport::uring).
  std::uint32_t ring = ~std::uint32_t{0};
  std::uint32_t slot = ~std::uint32_t{0};
};

} // namespace corodist::net
