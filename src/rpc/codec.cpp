// The RPC codec: the codec_context current on a thread, payloads encoded and
// parsed (bounded by their size), a call body viewed in place, and the names of
// types for errors.
#include <corodist/core/error.hpp>
#include <corodist/net/frame.hpp>
#include <corodist/rpc/codec.hpp>

#include "rpc/call_format.hpp"
#include "rpc/object_budget.hpp"

#include <cxxabi.h>

#include <cstdlib>

namespace corodist::rpc {

namespace {
thread_local codec_context* current_context = nullptr;
} // namespace

codec_context* codec_context::current() noexcept { return current_context; }

codec_scope::codec_scope(codec_context& ctx) noexcept : previous_(current_context) { current_context = &ctx; }

codec_scope::~codec_scope() { current_context = previous_; }

namespace {
constexpr std::size_t prefix_size = 8; // u32 body_len, u32 attachment_count
constexpr std::size_t max_depth = 256;
constexpr std::size_t zone_chunk_size = 512;
// A body may decode into at most this many times its size of msgpack objects,
// or this floor (small bodies of small values), whichever is more.
constexpr std::size_t decode_expansion = 4;
constexpr std::size_t decode_floor = std::size_t{16} << 20;

// Counts the msgpack objects a body would decode into, without making any;
// stops as soon as they would pass the budget.
struct object_counter : msgpack::null_visitor {
  std::size_t objects = 0;
  std::size_t budget = 0;
  bool over = false;
  bool count(std::size_t n = 1) {
    objects += n;
    if (objects > budget)
      over = true;
    return !over;
  }
  bool visit_nil() { return count(); }
  bool visit_boolean(bool) { return count(); }
  bool visit_positive_integer(std::uint64_t) { return count(); }
  bool visit_negative_integer(std::int64_t) { return count(); }
  bool visit_float32(float) { return count(); }
  bool visit_float64(double) { return count(); }
  bool visit_str(const char*, std::uint32_t) { return count(); }
  bool visit_bin(const char*, std::uint32_t) { return count(); }
  bool visit_ext(const char*, std::uint32_t) { return count(); }
  bool start_array(std::uint32_t) { return count(); }
  bool start_map(std::uint32_t n) { return count(1 + std::size_t{n}); } // key-value pairs take two object slots
  void parse_error(std::size_t, std::size_t) {}
  void insufficient_bytes(std::size_t, std::size_t) {}
};
} // namespace

std::size_t detail::object_budget(std::size_t n) noexcept {
  return std::max(decode_expansion * n, decode_floor) / sizeof(msgpack::object);
}

std::size_t detail::count_objects(const char* data, std::size_t n, std::size_t budget) {
  object_counter counter;
  counter.budget = budget;
  std::size_t off = 0;
  bool complete = false;
  try {
    complete = msgpack::v2::parse(data, n, off, counter);
  } catch (const std::exception& e) {
    throw protocol_error(std::string("not valid msgpack: ") + e.what());
  }
  if (!counter.over && (!complete || off != n))
    throw protocol_error("not one complete msgpack value");
  return counter.objects;
}

encoder::encoder(message_port* port, int self, int peer) : scope_(ctx_), packer_(*this) {
  ctx_.direction = codec_context::mode::encode;
  ctx_.port = port;
  ctx_.self = self;
  ctx_.peer = peer;
  out_.reserve(128); // then the prefix: one allocation per message
  out_.resize(prefix_size);
}

payload encoder::finish() {
  const std::size_t body_len = out_.size() - prefix_size;
  if (body_len > 0xffffffffu)
    throw usage_error("rpc: message body of " + std::to_string(body_len) + " bytes is too large");
  auto& segs = ctx_.out_attachments;
  corodist::store_le(out_.data(), static_cast<std::uint32_t>(body_len));
  corodist::store_le(out_.data() + 4, static_cast<std::uint32_t>(segs.size()));
  const std::size_t table = out_.size();
  out_.resize(table + 8 * segs.size());
  for (std::size_t i = 0; i < segs.size(); ++i)
    corodist::store_le(out_.data() + table + 8 * i, static_cast<std::uint64_t>(segs[i].data.size()));
  return payload{std::move(out_), std::move(segs), std::move(ctx_.records)};
}

payload encode_nil(encoder& e) {
  e.packer().pack_nil();
  return e.finish();
}

parsed_payload parse_payload(net::bytes&& payload, codec_context& ctx) {
  // A large payload's buffer goes back to net/'s cache once its last view is gone.
  auto owner = net::share_buffer(std::move(payload));
  const std::byte* d = owner->data();
  const std::size_t n = owner->size();
  auto bad = [&](const std::string& why) {
    return protocol_error("rpc: malformed message (" + std::to_string(n) + " bytes): " + why);
  };
  if (n < prefix_size)
    throw bad("shorter than its 8-byte header");
  const auto body_len = corodist::load_le<std::uint32_t>(d);
  const auto count = corodist::load_le<std::uint32_t>(d + 4);
  std::size_t pos = prefix_size;
  if (body_len > n - pos)
    throw bad("body length " + std::to_string(body_len) + " exceeds the message");
  const std::size_t body_at = pos;
  pos += body_len;
  if (count > (n - pos) / 8)
    throw bad("attachment table of " + std::to_string(count) + " entries exceeds the message");
  const std::size_t table = pos;
  pos += 8 * std::size_t{count};
  std::vector<std::span<const std::byte>> attachments;
  attachments.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto len = corodist::load_le<std::uint64_t>(d + table + 8 * i);
    if (len > n - pos)
      throw bad("attachment " + std::to_string(i) + " exceeds the message");
    attachments.emplace_back(d + pos, static_cast<std::size_t>(len));
    pos += static_cast<std::size_t>(len);
  }
  if (pos != n)
    throw bad(std::to_string(n - pos) + " trailing bytes");
  const auto* body = reinterpret_cast<const char*>(d + body_at);
  // Count before building: what decoding may allocate is bounded by the body.
  // A body counts at most 2 objects a byte (a value is at least a byte; a
  // map's n pairs add n to at least 2n bytes), so one that cannot pass the
  // budget is not counted: decoding it checks it as well.
  const std::size_t budget = detail::object_budget(body_len);
  if (2 * std::size_t{body_len} > budget) {
    std::size_t objects = 0;
    try {
      objects = detail::count_objects(body, body_len, budget);
    } catch (const protocol_error& e) {
      throw bad(std::string("body is ") + e.what());
    }
    if (objects > budget)
      throw bad("its " + std::to_string(body_len) + "-byte body would decode into more than " +
                std::to_string(budget) + " msgpack objects (more than " + std::to_string(decode_expansion) +
                "x its size in memory); send bulk data as rpc::attachment");
  }
  const std::size_t lim = std::size_t{body_len} + 1;
  parsed_payload p;
  std::size_t used = 0;
  try {
    // A small first zone chunk: msgpack's default (8 KiB) is a "large" malloc
    // that makes glibc consolidate its fast bins on every call.
    auto zone = std::make_unique<msgpack::zone>(zone_chunk_size);
    auto obj = msgpack::unpack(
        *zone, body, body_len, used, [](msgpack::type::object_type, std::size_t, void*) { return true; }, nullptr,
        msgpack::unpack_limit(lim, lim, lim, lim, lim, max_depth));
    p.body = msgpack::object_handle(obj, std::move(zone));
  } catch (const std::exception& e) {
    throw bad(std::string("body is not valid msgpack: ") + e.what());
  }
  if (used != body_len)
    throw bad("body is not one complete msgpack value (" + std::to_string(body_len - used) + " bytes after it)");
  ctx.direction = codec_context::mode::decode;
  ctx.in_owner = owner;
  ctx.in_attachments = std::move(attachments);
  p.owner = std::move(owner);
  return p;
}

payload nil_payload() {
  net::bytes b(prefix_size + 1);
  corodist::store_le(b.data(), std::uint32_t{1}); // the body: one byte
  corodist::store_le(b.data() + 4, std::uint32_t{0}); // no attachments
  b[prefix_size] = std::byte{0xc0}; // msgpack's nil
  return payload{std::move(b), {}, {}};
}

bool is_nil_payload(const net::bytes& payload) noexcept {
  return payload.size() == prefix_size + 1 && corodist::load_le<std::uint32_t>(payload.data()) == 1 &&
         corodist::load_le<std::uint32_t>(payload.data() + 4) == 0 && payload[prefix_size] == std::byte{0xc0};
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

std::string msgpack_type_name(msgpack::type::object_type t) {
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

namespace detail {

call_view view_call(const msgpack::object& body) {
  if (body.type != msgpack::type::ARRAY || (body.via.array.size != 3 && body.via.array.size != 4) ||
      body.via.array.ptr[0].type != msgpack::type::STR || body.via.array.ptr[2].type != msgpack::type::POSITIVE_INTEGER)
    throw protocol_error("rpc: a call is [name, [args...], timeout_ms] or [name, [args...], timeout_ms, {metadata}]");
  const auto& a = body.via.array;
  call_view v{std::string_view(a.ptr[0].via.str.ptr, a.ptr[0].via.str.size), &a.ptr[1], a.ptr[2].via.u64};
  if (a.size == 4) {
    const auto& m = a.ptr[3];
    if (m.type != msgpack::type::MAP)
      throw protocol_error("rpc: a call's metadata is not a map");
    for (std::uint32_t i = 0; i < m.via.map.size; ++i) {
      const auto& kv = m.via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR || kv.val.type != msgpack::type::STR)
        throw protocol_error("rpc: a call's metadata maps strings to strings");
      v.metadata_bytes += kv.key.via.str.size + kv.val.via.str.size;
    }
    v.metadata = &m;
  }
  return v;
}

call_metadata read_metadata(const call_view& v) {
  call_metadata out;
  if (!v.metadata)
    return out;
  const auto& m = v.metadata->via.map;
  out.reserve(m.size);
  for (std::uint32_t i = 0; i < m.size; ++i)
    out.emplace_back(std::string(m.ptr[i].key.via.str.ptr, m.ptr[i].key.via.str.size),
                     std::string(m.ptr[i].val.via.str.ptr, m.ptr[i].val.via.str.size));
  return out;
}

} // namespace detail

} // namespace corodist::rpc
