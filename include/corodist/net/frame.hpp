#pragma once
/// \file
/// The native wire format: a 16-byte hello, then frames with a fixed
/// little-endian 16-byte header `{u32 payload_len, u16 kind, u16 flags,
/// u64 request_id}` followed by `payload_len` bytes.

#include <corodist/core/config.hpp>

#include <corodist/core/little_endian.hpp>

#include <array>
#include <cstddef>
#include <cstdint>

namespace corodist::net {

/// "CDST" read as a little-endian u32: the first four bytes of a native connection.
inline constexpr std::uint32_t protocol_magic = 0x54534443;
/// The version this build speaks (3: heartbeats, frames of control_kind).
inline constexpr std::uint16_t protocol_version = 3;
/// Size of the hello and of a frame header, in bytes.
inline constexpr std::size_t hello_size = 16;
inline constexpr std::size_t header_size = 16;

/// A frame kind reserved for the connection itself (a one-way frame with an
/// empty payload is a heartbeat): handled inside net::connection and never
/// delivered to a request handler, so upper layers must not use it.
inline constexpr std::uint16_t control_kind = 0xffff;

/// Frame flags.
namespace frame_flags {
inline constexpr std::uint16_t response = 1u << 0; ///< answers the request with the same id
inline constexpr std::uint16_t error = 1u << 1;    ///< response carrying an error text
inline constexpr std::uint16_t one_way = 1u << 2;  ///< no response expected
} // namespace frame_flags

/// Hello flags.
namespace hello_flags {
/// Authentication (mutual). Client: it holds a token; its extension block is a
/// 32-byte nonce. Server: it requires a token; its extension block is its own
/// 32-byte nonce followed by its proof, HMAC-SHA-256(key = SHA-256(token),
/// "corodist-auth-v2 server" || client nonce || server nonce). The client then
/// sends its proof (the same with "corodist-auth-v2 client"), acknowledged by
/// one byte 0x01. A client with a token refuses a server without this flag.
inline constexpr std::uint16_t auth = 1u << 0;
} // namespace hello_flags

/// The opening message of each side: magic, version, flags, and the length of
/// an extension block that follows it (0 in version 1).
struct hello {
  std::uint32_t magic = protocol_magic;
  std::uint16_t version = protocol_version;
  std::uint16_t flags = 0;
  std::uint32_t extension_len = 0;
  std::uint32_t reserved = 0;
};

/// A frame header.
struct frame_header {
  std::uint32_t payload_len = 0;
  std::uint16_t kind = 0;
  std::uint16_t flags = 0;
  std::uint64_t request_id = 0;
};

/// Writes `h` as 16 little-endian bytes.
inline std::array<std::byte, header_size> encode(const frame_header& h) noexcept {
  std::array<std::byte, header_size> b;
  store_le(b.data(), h.payload_len);
  store_le(b.data() + 4, h.kind);
  store_le(b.data() + 6, h.flags);
  store_le(b.data() + 8, h.request_id);
  return b;
}

/// Reads a frame header from 16 bytes.
inline frame_header decode_header(const std::byte* p) noexcept {
  return {load_le<std::uint32_t>(p), load_le<std::uint16_t>(p + 4),
          load_le<std::uint16_t>(p + 6), load_le<std::uint64_t>(p + 8)};
}

/// Writes `h` as 16 little-endian bytes.
inline std::array<std::byte, hello_size> encode(const hello& h) noexcept {
  std::array<std::byte, hello_size> b;
  store_le(b.data(), h.magic);
  store_le(b.data() + 4, h.version);
  store_le(b.data() + 6, h.flags);
  store_le(b.data() + 8, h.extension_len);
  store_le(b.data() + 12, h.reserved);
  return b;
}

/// Reads a hello from 16 bytes.
inline hello decode_hello(const std::byte* p) noexcept {
  return {load_le<std::uint32_t>(p), load_le<std::uint16_t>(p + 4),
          load_le<std::uint16_t>(p + 6), load_le<std::uint32_t>(p + 8),
          load_le<std::uint32_t>(p + 12)};
}

} // namespace corodist::net
