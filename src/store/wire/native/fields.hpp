#pragma once
// The native store protocol's vocabulary (private): frame kinds, reply
// statuses, and the field encoding (writer, reader). request.hpp and reply.hpp
// build the messages from these.
//
// Every payload is a sequence of fields; strings are u32-length prefixed,
// integers little-endian. Every reply payload starts with a status byte
// (0 ok, 1 timeout, 2 error + message) followed by the result.

#include <corodist/core/error.hpp>
#include <corodist/net/connection.hpp>

#include <algorithm>
#include <cstdint>
#include <chrono>
#include <cstring>
#include <limits>
#include <span>
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
  set_owned,
  watch_event = 100, // one-way, server -> client
};

enum class status : std::uint8_t { ok = 0, timeout = 1, error = 2 };

class writer {
public:
  writer() = default;
  explicit writer(status s) { u8(static_cast<std::uint8_t>(s)); }
  /// Reserves room for `n` more bytes.
  writer& reserve(std::size_t n) {
    out_.reserve(out_.size() + n);
    return *this;
  }
  writer& u8(std::uint8_t v) {
    out_.push_back(static_cast<std::byte>(v));
    return *this;
  }
  writer& u32(std::uint32_t v) { return raw(&v, 4); }
  writer& u64(std::uint64_t v) { return raw(&v, 8); }
  writer& i64(std::int64_t v) { return raw(&v, 8); }
  /// A deadline as a u64 count of milliseconds (negative: 0).
  writer& millis(std::chrono::milliseconds t) {
    return u64(static_cast<std::uint64_t>(std::max<std::int64_t>(0, t.count())));
  }
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

/// Reads fields from a payload it views; throws protocol_error on a short or
/// malformed one. It never allocates more than the payload's size (a count is
/// checked against the bytes left before anything is reserved).
class reader {
public:
  explicit reader(std::span<const std::byte> b) : p_(b.data()), end_(b.data() + b.size()) {}
  std::uint8_t u8() {
    need(1);
    return std::to_integer<std::uint8_t>(*p_++);
  }
  std::uint32_t u32() { return fixed<std::uint32_t>(); }
  std::uint64_t u64() { return fixed<std::uint64_t>(); }
  std::int64_t i64() { return fixed<std::int64_t>(); }
  /// A u64 count of milliseconds (values past int64 saturate).
  std::chrono::milliseconds millis() {
    const auto v = u64();
    constexpr auto max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    return std::chrono::milliseconds(static_cast<std::int64_t>(std::min(v, max)));
  }
  std::string str() { return std::string(str_view()); }
  /// As str(), viewing the bytes in place (valid while the payload is).
  std::string_view str_view() {
    auto n = u32();
    need(n);
    std::string_view s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  std::vector<std::string> strs() { return strs_as<std::string>(); }
  /// As strs(), viewing the strings in place (valid while the payload is).
  std::vector<std::string_view> str_views() { return strs_as<std::string_view>(); }
  /// Throws protocol_error unless every byte was read.
  void end() const {
    if (p_ != end_)
      throw protocol_error("store: " + std::to_string(left()) + " unexpected bytes after the fields");
  }
  std::size_t left() const noexcept { return static_cast<std::size_t>(end_ - p_); }

private:
  template <typename S>
  std::vector<S> strs_as() {
    auto n = u32();
    if (n > left() / 4) // each string takes at least its 4-byte length
      throw protocol_error("store: a list of " + std::to_string(n) + " strings in " + std::to_string(left()) +
                           " bytes");
    std::vector<S> v;
    v.reserve(n);
    for (std::uint32_t i = 0; i < n; ++i)
      v.emplace_back(str_view());
    return v;
  }

public:

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
    if (left() < n)
      throw protocol_error("store: truncated request or response payload");
  }
  const std::byte* p_;
  const std::byte* end_;
};

} // namespace corodist::store::detail
