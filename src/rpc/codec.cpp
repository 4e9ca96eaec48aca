#include <corodist/core/error.hpp>
#include <corodist/net/frame.hpp>
#include <corodist/rpc/detail/codec.hpp>

#include "net/buffer_cache.hpp"

#include <cxxabi.h>

#include <cstdlib>

namespace corodist::rpc::detail {

namespace {
constexpr std::size_t prefix_size = 8; // u32 body_len, u32 attachment_count
constexpr std::size_t max_depth = 256;
constexpr std::size_t zone_chunk_size = 512;
} // namespace

encode_context*& current_encode() noexcept {
  thread_local encode_context* ctx = nullptr;
  return ctx;
}

const decode_context*& current_decode() noexcept {
  thread_local const decode_context* ctx = nullptr;
  return ctx;
}

encoder::encoder() : prev_(current_encode()), packer_(*this) {
  out_.reserve(128); // then the prefix: one allocation per message
  out_.resize(prefix_size);
  current_encode() = &ctx_;
}

encoder::~encoder() { current_encode() = prev_; }

encoded encoder::finish() {
  const std::size_t body_len = out_.size() - prefix_size;
  if (body_len > 0xffffffffu)
    throw usage_error("rpc: message body of " + std::to_string(body_len) + " bytes is too large");
  net::detail::store_le(out_.data(), static_cast<std::uint32_t>(body_len));
  net::detail::store_le(out_.data() + 4, static_cast<std::uint32_t>(ctx_.segments.size()));
  const std::size_t table = out_.size();
  out_.resize(table + 8 * ctx_.segments.size());
  for (std::size_t i = 0; i < ctx_.segments.size(); ++i)
    net::detail::store_le(out_.data() + table + 8 * i, static_cast<std::uint64_t>(ctx_.segments[i].data.size()));
  return encoded{std::move(out_), std::move(ctx_.segments)};
}

encoded encode_nil() {
  encoder e;
  e.packer().pack_nil();
  return e.finish();
}

parsed_payload parse_payload(net::bytes&& payload) {
  // A large payload's buffer goes back to net/'s cache once its last view is gone.
  std::shared_ptr<net::bytes> owner;
  if (payload.capacity() >= net::detail::recycle_min_size)
    owner = std::shared_ptr<net::bytes>(new net::bytes(std::move(payload)), [](net::bytes* b) {
      net::detail::recycle_large_buffer(std::move(*b));
      delete b;
    });
  else
    owner = std::make_shared<net::bytes>(std::move(payload));
  const std::byte* d = owner->data();
  const std::size_t n = owner->size();
  auto bad = [&](const std::string& why) {
    return protocol_error("rpc: malformed message (" + std::to_string(n) + " bytes): " + why);
  };
  if (n < prefix_size)
    throw bad("shorter than its 8-byte header");
  const auto body_len = net::detail::load_le<std::uint32_t>(d);
  const auto count = net::detail::load_le<std::uint32_t>(d + 4);
  std::size_t pos = prefix_size;
  if (body_len > n - pos)
    throw bad("body length " + std::to_string(body_len) + " exceeds the message");
  const std::size_t body_at = pos;
  pos += body_len;
  if (count > (n - pos) / 8)
    throw bad("attachment table of " + std::to_string(count) + " entries exceeds the message");
  const std::size_t table = pos;
  pos += 8 * std::size_t{count};
  parsed_payload p;
  p.attachments.attachments.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto len = net::detail::load_le<std::uint64_t>(d + table + 8 * i);
    if (len > n - pos)
      throw bad("attachment " + std::to_string(i) + " exceeds the message");
    p.attachments.attachments.emplace_back(d + pos, static_cast<std::size_t>(len));
    pos += static_cast<std::size_t>(len);
  }
  if (pos != n)
    throw bad(std::to_string(n - pos) + " trailing bytes");
  const std::size_t lim = std::size_t{body_len} + 1;
  try {
    // A small first zone chunk: msgpack's default (8 KiB) is a "large" malloc
    // that makes glibc consolidate its fast bins on every call.
    auto zone = std::make_unique<msgpack::zone>(zone_chunk_size);
    auto obj = msgpack::unpack(
        *zone, reinterpret_cast<const char*>(d + body_at), body_len,
        [](msgpack::type::object_type, std::size_t, void*) { return true; }, nullptr,
        msgpack::unpack_limit(lim, lim, lim, lim, lim, max_depth));
    p.body = msgpack::object_handle(obj, std::move(zone));
  } catch (const std::exception& e) {
    throw bad(std::string("body is not valid msgpack: ") + e.what());
  }
  p.attachments.owner = std::move(owner);
  return p;
}

std::string demangle(const char* mangled) {
  int status = 0;
  char* s = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  if (status != 0 || !s)
    return mangled;
  std::string out(s);
  std::free(s);
  return out;
}

std::string type_name(msgpack::type::object_type t) {
  switch (t) {
  case msgpack::type::NIL: return "nil";
  case msgpack::type::BOOLEAN: return "boolean";
  case msgpack::type::POSITIVE_INTEGER: return "positive integer";
  case msgpack::type::NEGATIVE_INTEGER: return "negative integer";
  case msgpack::type::FLOAT32: return "float32";
  case msgpack::type::FLOAT64: return "float64";
  case msgpack::type::STR: return "str";
  case msgpack::type::BIN: return "bin";
  case msgpack::type::ARRAY: return "array";
  case msgpack::type::MAP: return "map";
  case msgpack::type::EXT: return "ext";
  }
  return "unknown";
}

} // namespace corodist::rpc::detail
