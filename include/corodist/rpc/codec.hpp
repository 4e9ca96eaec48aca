#pragma once
/// \file
/// corodist::rpc's codec for the layers above rpc/ (rref/ is one): encoding a
/// message payload and decoding one under a codec_context, packing values into
/// a body and converting decoded values to C++ types, and the msgpack adaptors
/// of rpc::attachment. What only rpc/ itself uses (the call format, registered
/// functions) is in detail/codec.hpp.
///
/// A payload (rpc::payload) is a little-endian prefix `u32 body_len, u32
/// attachment_count`, the msgpack body, then `u64 length` per attachment; the
/// attachments follow on the wire. An attachment inside a body is msgpack ext
/// type 0x41 whose 4 bytes are a little-endian index into the attachment table.

#include <corodist/core/config.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/little_endian.hpp>
#include <corodist/net/frame.hpp>
#include <corodist/rpc/attachment.hpp>
#include <corodist/rpc/codec_context.hpp>
#include <corodist/rpc/payload.hpp>

#include <msgpack.hpp>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>

namespace corodist::rpc {

/// msgpack ext type that marks an attachment reference (body: u32 index).
inline constexpr std::int8_t attachment_ext_type = 0x41;

/// Packs one payload: a msgpack stream writer whose codec_context (current on
/// this thread while it lives) collects the attachments and upper layers'
/// records. Not movable; one thread.
class encoder {
public:
  /// `port`, `self`, `peer`: what the codec_context tells adaptors (the
  /// destination is `peer`; null / -1 for a message tied to no agent).
  encoder(message_port* port = nullptr, int self = -1, int peer = -1);
  ~encoder() = default;
  encoder(const encoder&) = delete;
  encoder& operator=(const encoder&) = delete;

  /// msgpack's stream interface.
  void write(const char* p, std::size_t n) {
    const auto* b = reinterpret_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  /// The packer to write the body with (one msgpack value).
  msgpack::packer<encoder>& packer() noexcept { return packer_; }
  /// Completes the payload (prefix, attachment table). Throws usage_error if
  /// the body passes 4 GiB.
  payload finish();

private:
  net::bytes out_;
  codec_context ctx_;
  codec_scope scope_;
  msgpack::packer<encoder> packer_;
};

/// A received payload, parsed: the msgpack body (referencing the payload, which
/// `owner` -- and the context's `in_owner` -- keeps alive); the attachments went
/// to the context.
struct parsed_payload {
  msgpack::object_handle body;
  std::shared_ptr<const void> owner;
};

/// Parses a payload into `ctx` (in_owner, in_attachments) and the body; decode
/// the body's values with `ctx` current (a codec_scope). Bounded in time and
/// memory by the payload: lengths are checked against it, and the body may
/// decode into at most max(4 x its size, 16 MiB) of msgpack objects (counted
/// before any is made). Throws protocol_error saying what is wrong. Any thread.
/// The fuzzing entry point of the RPC decoder.
parsed_payload parse_payload(net::bytes&& payload, codec_context& ctx);

/// True if `payload` is exactly what encode_nil makes: a nil body and no
/// attachments (a void function's reply), which needs no parsing. Any thread.
bool is_nil_payload(const net::bytes& payload) noexcept;

/// The readable name of a type from its mangled name (typeid(T).name()), as
/// errors and remote_error::type() give it.
std::string demangle(const char* mangled);

/// The name of a msgpack object type ("str", "positive integer", ...), for errors.
std::string msgpack_type_name(msgpack::type::object_type t);

/// Thrown by decode_value when a value does not decode to the type asked for.
class value_type_error : public error {
public:
  using error::error;
};

/// Packs one value into a body (an encoder's, or a stream's items); C strings
/// and string views as msgpack str.
template <typename Stream, typename T>
void pack_value(msgpack::packer<Stream>& pk, const T& v) {
  if constexpr (std::is_convertible_v<const T&, std::string_view> && !std::is_same_v<T, std::string>) {
    const std::string_view s(v);
    pk.pack_str(static_cast<std::uint32_t>(s.size()));
    pk.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
  } else {
    pk.pack(v);
  }
}

/// Encodes a payload whose body is the value `v` with `e`.
template <typename T>
payload encode_value(encoder& e, const T& v) {
  pack_value(e.packer(), v);
  return e.finish();
}
/// Encodes a payload whose body is nil (a void result) with `e`.
payload encode_nil(encoder& e);
/// The payload encode_nil makes (a nil body, no attachments), made without
/// an encoder: a void function's reply. Any thread.
payload nil_payload();

/// Converts a decoded value to T (nothing for void); call with the payload's
/// codec_context current. Throws value_type_error saying what was received
/// instead.
template <typename T>
T decode_value(const msgpack::object& o) {
  if constexpr (!std::is_void_v<T>) {
    try {
      return o.as<T>();
    } catch (const std::exception& e) {
      throw value_type_error("the value (msgpack " + msgpack_type_name(o.type) + ") does not decode to " +
                             demangle(typeid(T).name()) + " (" + e.what() + ")");
    }
  }
}

} // namespace corodist::rpc

// ---- msgpack adaptors for rpc::attachment -----------------------------------

namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
  namespace adaptor {

  template <>
  struct pack<corodist::rpc::attachment> {
    template <typename Stream>
    msgpack::packer<Stream>& operator()(msgpack::packer<Stream>& o, const corodist::rpc::attachment& a) const {
      auto* ctx = corodist::rpc::codec_context::current();
      if (!ctx || ctx->direction != corodist::rpc::codec_context::mode::encode)
        throw corodist::usage_error("rpc::attachment can only be packed as part of an RPC message");
      const auto idx = static_cast<std::uint32_t>(ctx->out_attachments.size());
      ctx->out_attachments.push_back(corodist::net::segment{a.owner(), asio::const_buffer(a.data(), a.size())});
      std::byte b[4];
      corodist::store_le(b, idx);
      o.pack_ext(4, corodist::rpc::attachment_ext_type);
      o.pack_ext_body(reinterpret_cast<const char*>(b), 4);
      return o;
    }
  };

  template <>
  struct convert<corodist::rpc::attachment> {
    const msgpack::object& operator()(const msgpack::object& o, corodist::rpc::attachment& v) const {
      if (o.type != msgpack::type::EXT || o.via.ext.type() != corodist::rpc::attachment_ext_type ||
          o.via.ext.size != 4)
        throw msgpack::type_error();
      const auto* ctx = corodist::rpc::codec_context::current();
      if (!ctx || ctx->direction != corodist::rpc::codec_context::mode::decode)
        throw msgpack::type_error();
      const auto idx =
          corodist::load_le<std::uint32_t>(reinterpret_cast<const std::byte*>(o.via.ext.data()));
      if (idx >= ctx->in_attachments.size())
        throw msgpack::type_error();
      v = corodist::rpc::attachment(ctx->in_owner, ctx->in_attachments[idx]);
      return o;
    }
  };

  } // namespace adaptor
} // MSGPACK_API_VERSION_NAMESPACE
} // namespace msgpack
