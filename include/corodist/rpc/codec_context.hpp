#pragma once
/// \file
/// corodist::rpc::codec_context: what msgpack adaptors see while one message
/// is encoded or decoded -- this worker, the peer, the attachments, and room
/// for upper layers (an rref records the forks it makes while encoded).

#include <corodist/core/config.hpp>

#include <corodist/net/connection.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

namespace corodist::rpc {

class message_port;

/// The context of the message being encoded or decoded on this thread, made
/// current by a `codec_scope` for exactly that encode or decode. Adaptors reach
/// it through `codec_context::current()` (null outside any message).
struct codec_context {
  enum class mode { encode, decode };

  mode direction = mode::encode;
  /// The local worker's port (null when the message is not tied to an agent).
  message_port* port = nullptr;
  /// This worker's rank, and the peer's: the destination when encoding, the
  /// sender when decoding; -1 when unknown.
  int self = -1;
  int peer = -1;

  /// Encoding: the attachments collected so far (written after the body).
  std::vector<net::segment> out_attachments;
  /// Decoding: the received attachments, viewed in place, and what keeps them alive.
  std::shared_ptr<const void> in_owner;
  std::vector<std::span<const std::byte>> in_attachments;

  /// Objects an upper layer ties to this message: they stay alive until the
  /// message has been handed to the network, or its send has failed, and are
  /// then released (an rref holds its parent's fork this way).
  std::vector<std::shared_ptr<void>> records;

  /// The context current on this thread, or null.
  static codec_context* current() noexcept;
};

/// Makes `ctx` the current codec_context of this thread for its lifetime
/// (restoring the previous one after). Not movable.
class codec_scope {
public:
  explicit codec_scope(codec_context& ctx) noexcept;
  ~codec_scope();
  codec_scope(const codec_scope&) = delete;
  codec_scope& operator=(const codec_scope&) = delete;

private:
  codec_context* previous_;
};

} // namespace corodist::rpc
