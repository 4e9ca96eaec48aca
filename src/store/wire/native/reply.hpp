#pragma once
// The replies of the native store protocol (private). The server writes a
// status byte and the result fields; the client reads the status once, when
// it opens the reply, and then reads the fields from just after it.
//
// The result fields per request: set, append, multi_set, wait, watch,
// unwatch: none; get: str value; add, num_keys: i64; compare_set: str;
// delete_key, check: u8 (0 or 1); multi_get, list_keys: strs.

#include <corodist/store/errors.hpp>
#include "store/wire/native/fields.hpp"

#include <span>
#include <string>
#include <string_view>

namespace corodist::store::detail {

/// A reply with status ok; append its result fields.
inline writer ok_reply() { return writer(status::ok); }

/// A reply with status `s` (timeout or error) and the text the client throws.
inline net::bytes failed_reply(status s, std::string_view text) {
  return writer(s).reserve(4 + text.size()).str(text).take();
}

/// A reply as the client reads it: its result fields, from just after the status.
class reply {
public:
  /// Opens the payload of a reply. Status ok gives the reply; timeout throws
  /// timeout_error and error throws store_error, each with the server's text;
  /// an empty payload or an unknown status throws protocol_error. Pure: with
  /// the result readers, the fuzzing entry point of a client's replies.
  explicit reply(net::bytes payload) : payload_(std::move(payload)), in_(payload_) {
    const auto s = in_.u8();
    if (s == static_cast<std::uint8_t>(status::ok))
      return;
    if (s == static_cast<std::uint8_t>(status::timeout))
      throw timeout_error(in_.str());
    if (s == static_cast<std::uint8_t>(status::error))
      throw store_error("store server: " + in_.str());
    throw protocol_error("store: reply with unknown status " + std::to_string(s));
  }
  // Moving keeps the vector's buffer, into which `in_` points.
  reply(reply&&) noexcept = default;
  reply& operator=(reply&&) = delete;
  reply(const reply&) = delete;

  std::uint8_t u8() { return in_.u8(); }
  std::int64_t i64() { return in_.i64(); }
  std::string str() { return in_.str(); }
  std::vector<std::string> strs() { return in_.strs(); }

private:
  net::bytes payload_;
  reader in_;
};

} // namespace corodist::store::detail
