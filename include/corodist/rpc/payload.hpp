#pragma once
/// \file
/// corodist::rpc::payload: an encoded RPC message (a msgpack body and its attachments).

#include <corodist/core/config.hpp>

#include <corodist/net/connection.hpp>

#include <memory>
#include <vector>

namespace corodist::rpc {

/// An encoded message as it goes on the wire: the owned part of the frame
/// payload (a little-endian prefix `u32 body_len, u32 attachment_count`, the
/// msgpack body, then `u64 length` per attachment) and the attachments, which
/// are written in place after it (scatter/gather), never copied.
struct payload {
  net::bytes body;
  std::vector<net::segment> attachments;
  /// What upper layers tied to the message while it was encoded
  /// (codec_context::records): kept alive until it is sent or has failed.
  std::vector<std::shared_ptr<void>> records;

  /// Bytes on the wire: the owned part plus every attachment.
  std::size_t size() const noexcept {
    std::size_t n = body.size();
    for (auto& a : attachments)
      n += a.data.size();
    return n;
  }
};

} // namespace corodist::rpc
