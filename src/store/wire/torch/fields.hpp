#pragma once
// PyTorch's TCPStore wire protocol (private): query codes of both versions,
// and the field encoding (cursor, encoder) that query.hpp's decoder and
// encoder, the server's sessions and our client's response reads share.
//
// A query is one type byte, then fields in host byte order (little-endian on
// every platform we build for): strings and byte vectors are a u64 length and
// the bytes; key lists are a u64 count and the strings. There are no request
// ids: one query is answered at a time, in order.
//
// PyTorch 1.13 ("v1") and PyTorch 2.x ("v2") number the queries differently;
// a v2 connection opens with VALIDATE (code 0) carrying `validate_magic`.

#include <corodist/core/error.hpp>
#include <corodist/store/errors.hpp>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace corodist::store::detail::torch {

inline constexpr std::uint32_t validate_magic = 0x3C85F7CE;

/// Query kinds, independent of the version that numbers them.
enum class query_kind : std::uint8_t {
  validate,
  set,
  compare_set,
  get,
  add,
  check,
  wait,
  num_keys,
  watch_key,
  delete_key,
  append,
  multi_get,
  multi_set,
  cancel_wait,
  ping,
  queue_push,
  queue_pop,
  queue_len,
};

enum class version : std::uint8_t { v1, v2 };

/// PyTorch 1.13's QueryType order.
inline constexpr query_kind v1_queries[] = {
    query_kind::set,  query_kind::compare_set, query_kind::get,       query_kind::add,       query_kind::check,
    query_kind::wait, query_kind::num_keys,    query_kind::watch_key, query_kind::delete_key};
/// PyTorch 2.x's QueryType order.
inline constexpr query_kind v2_queries[] = {
    query_kind::validate,   query_kind::set,        query_kind::compare_set, query_kind::get,
    query_kind::add,        query_kind::check,      query_kind::wait,        query_kind::num_keys,
    query_kind::delete_key, query_kind::append,     query_kind::multi_get,   query_kind::multi_set,
    query_kind::cancel_wait, query_kind::ping,      query_kind::queue_push,  query_kind::queue_pop,
    query_kind::queue_len};

/// The query a code means in `v`, or nullopt for an unknown code.
inline std::optional<query_kind> kind_of_code(version v, std::uint8_t code) {
  if (v == version::v1)
    return code < std::size(v1_queries) ? std::optional(v1_queries[code]) : std::nullopt;
  return code < std::size(v2_queries) ? std::optional(v2_queries[code]) : std::nullopt;
}

/// The code of `q` in `v`; throws store_error if `v` has no such query.
inline std::uint8_t code_of(version v, query_kind q) {
  auto find = [&](const auto& table) -> std::optional<std::uint8_t> {
    for (std::size_t i = 0; i < std::size(table); ++i)
      if (table[i] == q)
        return static_cast<std::uint8_t>(i);
    return std::nullopt;
  };
  auto code = v == version::v1 ? find(v1_queries) : find(v2_queries);
  if (!code)
    throw store_error(std::string("this operation is not in the PyTorch ") + (v == version::v1 ? "1.13" : "2.x") +
                      " TCPStore protocol");
  return *code;
}

// Response bytes.
inline constexpr std::uint8_t check_ready = 0, check_not_ready = 1;
inline constexpr std::uint8_t wait_stop_waiting = 0, wait_canceled = 1;

/// "1.13" or "2.x".
inline const char* version_name(version v) { return v == version::v1 ? "1.13" : "2.x"; }

/// Reads fields from a buffer that may not yet hold a whole query: each read
/// returns false when the bytes are not all there (read more and parse the
/// query again), and throws protocol_error for a length above its limit.
class cursor {
public:
  cursor(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  bool u8(std::uint8_t& v) { return raw(&v, 1); }
  bool u32(std::uint32_t& v) { return raw(&v, 4); }
  bool u64(std::uint64_t& v) { return raw(&v, 8); }
  bool i64(std::int64_t& v) { return raw(&v, 8); }
  bool bytes(std::string& s, std::size_t max, const char* what) {
    std::string_view v;
    if (!field(v, max, what))
      return false;
    s.assign(v);
    return true;
  }
  /// Like bytes() without copying: whether a whole length-prefixed field is there.
  bool skip(std::size_t max, const char* what) {
    std::string_view ignored;
    return field(ignored, max, what);
  }
  /// A u64 count (at most `max_count`) and that many strings (`String`:
  /// std::string copies them, std::string_view views them in place, valid
  /// while the input is). Checks that all are there before taking any (a long
  /// list arriving in many reads is parsed again after each; taking them only
  /// once keeps that linear).
  template <typename String>
  bool keys(std::vector<String>& out, std::size_t max_count, std::size_t max_key) {
    std::uint64_t n = 0;
    if (!u64(n))
      return false;
    if (n > max_count)
      throw protocol_error(std::to_string(n) + " keys in one query exceed the limit of " + std::to_string(max_count));
    cursor scan = *this;
    for (std::uint64_t i = 0; i < n; ++i)
      if (!scan.skip(max_key, "key"))
        return false;
    out.resize(n);
    for (auto& k : out) {
      std::string_view v;
      if (!field(v, max_key, "key"))
        return false;
      k = String(v);
    }
    return true;
  }
  std::size_t consumed() const noexcept { return off_; }

private:
  // A u64 length (at most `max`) and that many bytes, viewed in place.
  bool field(std::string_view& v, std::size_t max, const char* what) {
    std::uint64_t n = 0;
    if (!u64(n))
      return false;
    if (n > max)
      throw protocol_error(std::string(what) + " of " + std::to_string(n) + " bytes exceeds the limit of " +
                           std::to_string(max));
    if (size_ - off_ < n)
      return false;
    v = std::string_view(reinterpret_cast<const char*>(data_ + off_), n);
    off_ += n;
    return true;
  }
  bool raw(void* p, std::size_t n) {
    if (size_ - off_ < n)
      return false;
    std::memcpy(p, data_ + off_, n);
    off_ += n;
    return true;
  }
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t off_ = 0;
};

/// Appends fields in the wire encoding.
class encoder {
public:
  explicit encoder(std::string& out) : out_(out) {}
  encoder& u8(std::uint8_t v) { return raw(&v, 1); }
  encoder& u32(std::uint32_t v) { return raw(&v, 4); }
  encoder& u64(std::uint64_t v) { return raw(&v, 8); }
  encoder& i64(std::int64_t v) { return raw(&v, 8); }
  encoder& bytes(std::string_view s) {
    u64(s.size());
    out_.append(s);
    return *this;
  }
  encoder& keys(const std::vector<std::string>& ks) {
    u64(ks.size());
    for (auto& k : ks)
      bytes(k);
    return *this;
  }

private:
  encoder& raw(const void* p, std::size_t n) {
    out_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string& out_;
};

} // namespace corodist::store::detail::torch
