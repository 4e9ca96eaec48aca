#pragma once
// The native store protocol: frame kinds and payload encoding (private).
//
// Every request payload is a sequence of fields; strings are u32-length
// prefixed, integers little-endian. Every response payload starts with a
// status byte (0 ok, 1 timeout, 2 error + message) followed by the result.

#include <corodist/core/error.hpp>
#include <corodist/net/connection.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace corodist::store::detail {

enum class op : std::uint16_t {
  set = 1,
  get,
  add,
  compare_set,
  delete_key,
  check,
  wait,
  num_keys,
  append,
  multi_get,
  multi_set,
  list_keys,
  watch,
  unwatch,
  watch_event = 100, // one-way, server -> client
};

enum class status : std::uint8_t { ok = 0, timeout = 1, error = 2 };

class writer {
public:
  writer() = default;
  explicit writer(status s) { u8(static_cast<std::uint8_t>(s)); }
  writer& u8(std::uint8_t v) {
    out_.push_back(static_cast<std::byte>(v));
    return *this;
  }
  writer& u32(std::uint32_t v) { return raw(&v, 4); }
  writer& u64(std::uint64_t v) { return raw(&v, 8); }
  writer& i64(std::int64_t v) { return raw(&v, 8); }
  writer& str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    return raw(s.data(), s.size());
  }
  writer& strs(const std::vector<std::string>& v) {
    u32(static_cast<std::uint32_t>(v.size()));
    for (auto& s : v)
      str(s);
    return *this;
  }
  net::bytes take() { return std::move(out_); }

private:
  writer& raw(const void* p, std::size_t n) { // little-endian hosts (x86-64, aarch64)
    auto b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
    return *this;
  }
  net::bytes out_;
};

/// Reads fields; throws protocol_error on a short or malformed payload.
class reader {
public:
  explicit reader(const net::bytes& b) : p_(b.data()), end_(b.data() + b.size()) {}
  /// Reads `b` after its first `skip` bytes (e.g. a response's status byte).
  reader(const net::bytes& b, std::size_t skip) : reader(b) {
    need(skip);
    p_ += skip;
  }
  std::uint8_t u8() {
    need(1);
    return std::to_integer<std::uint8_t>(*p_++);
  }
  std::uint32_t u32() { return fixed<std::uint32_t>(); }
  std::uint64_t u64() { return fixed<std::uint64_t>(); }
  std::int64_t i64() { return fixed<std::int64_t>(); }
  std::string str() {
    auto n = u32();
    need(n);
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  std::vector<std::string> strs(std::size_t max_count) {
    auto n = u32();
    if (n > max_count)
      throw store_error("too many keys in one request: " + std::to_string(n) + " (limit " +
                        std::to_string(max_count) + ")");
    std::vector<std::string> v;
    v.reserve(n);
    for (std::uint32_t i = 0; i < n; ++i)
      v.push_back(str());
    return v;
  }
  bool done() const noexcept { return p_ == end_; }

private:
  template <typename T>
  T fixed() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  void need(std::size_t n) const {
    if (static_cast<std::size_t>(end_ - p_) < n)
      throw protocol_error("store: truncated request or response payload");
  }
  const std::byte* p_;
  const std::byte* end_;
};

} // namespace corodist::store::detail
