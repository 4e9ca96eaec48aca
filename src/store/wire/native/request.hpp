#pragma once
// The requests of the native store protocol (private): one plain struct per
// operation, encoded by tcp_store and decoded by the server's sessions with
// the pure functions below (bytes in, request or error out).

#include <corodist/store/watch_event.hpp>

#include "store/wire/native/fields.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace corodist::store::detail {

struct set_request {
  static constexpr op kind = op::set;
  std::string key;
  std::string value;
};

/// Waits up to `timeout` (zero: forever) for `key`, then answers its value.
struct get_request {
  static constexpr op kind = op::get;
  std::string key;
  std::chrono::milliseconds timeout{0};
};

struct add_request {
  static constexpr op kind = op::add;
  std::string key;
  std::int64_t delta = 0;
};

struct compare_set_request {
  static constexpr op kind = op::compare_set;
  std::string key;
  std::string expected;
  std::string desired;
};

struct delete_key_request {
  static constexpr op kind = op::delete_key;
  std::string key;
};

struct check_request {
  static constexpr op kind = op::check;
  std::vector<std::string> keys;
};

struct wait_request {
  static constexpr op kind = op::wait;
  std::vector<std::string> keys;
  std::chrono::milliseconds timeout{0};
};

struct num_keys_request {
  static constexpr op kind = op::num_keys;
};

struct append_request {
  static constexpr op kind = op::append;
  std::string key;
  std::string value;
};

struct multi_get_request {
  static constexpr op kind = op::multi_get;
  std::vector<std::string> keys;
  std::chrono::milliseconds timeout{0};
};

struct multi_set_request {
  static constexpr op kind = op::multi_set;
  std::vector<std::string> keys;
  std::vector<std::string> values;
};

struct list_keys_request {
  static constexpr op kind = op::list_keys;
  std::string prefix;
};

/// Subscribes to `key`; events name the client's `watch_id`.
struct watch_request {
  static constexpr op kind = op::watch;
  std::string key;
  std::uint64_t watch_id = 0;
};

/// As set; the key is deleted when this connection closes, unless a later
/// write took it over.
struct set_owned_request {
  static constexpr op kind = op::set_owned;
  std::string key;
  std::string value;
};

struct unwatch_request {
  static constexpr op kind = op::unwatch;
  std::uint64_t watch_id = 0;
};

using request = std::variant<set_request, get_request, add_request, compare_set_request, delete_key_request,
                             check_request, wait_request, num_keys_request, append_request, multi_get_request,
                             multi_set_request, list_keys_request, watch_request, unwatch_request,
                             set_owned_request>;

/// The frame kind that carries `r`.
op kind_of(const request& r) noexcept;

/// How long `r` may wait at the server for keys to appear (its `timeout`,
/// zero: forever), or nullopt for a request that never waits.
std::optional<std::chrono::milliseconds> wait_of(const request& r) noexcept;

/// The frame payload of `r`.
net::bytes encode_request(const request& r);

/// Decodes the payload of a request frame of kind `kind`. Returns nullopt for
/// a kind that is no store operation; throws protocol_error for a payload that
/// is truncated, malformed or followed by extra bytes. Pure (no I/O, no
/// executor) and allocates at most about the payload's size: this is the
/// fuzzing entry point of the native store protocol.
std::optional<request> decode_request(std::uint16_t kind, std::span<const std::byte> payload);

/// The keys a request frame of kind `kind` waits for (op::wait,
/// op::multi_get), as views into `payload`, or nullopt for any other kind.
/// Throws protocol_error for a malformed key list. Copies no key: the server
/// checks a wait against its limits with these before decode_request copies
/// the keys, so a refused wait never holds their memory.
std::optional<std::vector<std::string_view>> wait_keys_of(std::uint16_t kind, std::span<const std::byte> payload);

/// A watch event frame (one-way, server to client, kind op::watch_event).
struct watch_event_frame {
  std::uint64_t watch_id = 0;
  watch_event event;
};

/// The payload of a watch event frame.
net::bytes encode_watch_event(std::uint64_t watch_id, const watch_event& e);

/// Decodes a watch event frame's payload; throws protocol_error for a
/// malformed one (or an unknown event kind). Pure; the fuzzing entry point of
/// the client's side of the native protocol, with reply's constructor.
watch_event_frame decode_watch_event(std::span<const std::byte> payload);

} // namespace corodist::store::detail
