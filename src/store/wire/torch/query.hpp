#pragma once
// The queries of PyTorch's TCPStore protocol (private): one plain struct per
// query, decoded by our server's sessions and encoded by our client with the
// pure functions below (bytes in, query or error out).

#include <corodist/store/errors.hpp>
#include "store/server/engine.hpp"
#include "store/wire/torch/fields.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace corodist::store::detail::torch {

/// 2.x's first query: `magic` must be validate_magic. No response.
struct validate_query {
  static constexpr query_kind kind = query_kind::validate;
  std::uint32_t magic = validate_magic;
};
/// Answered with `nonce`.
struct ping_query {
  static constexpr query_kind kind = query_kind::ping;
  std::uint32_t nonce = 0;
};
/// No response.
struct set_query {
  static constexpr query_kind kind = query_kind::set;
  std::string key;
  std::string value;
};
/// Answered with the value compareSet leaves (bytes).
struct compare_set_query {
  static constexpr query_kind kind = query_kind::compare_set;
  std::string key;
  std::string expected;
  std::string desired;
};
/// Answered with the value (bytes), empty when missing (clients WAIT first).
struct get_query {
  static constexpr query_kind kind = query_kind::get;
  std::string key;
};
/// Answered with the new value (i64).
struct add_query {
  static constexpr query_kind kind = query_kind::add;
  std::string key;
  std::int64_t delta = 0;
};
/// Answered check_ready or check_not_ready (u8).
struct check_query {
  static constexpr query_kind kind = query_kind::check;
  std::vector<std::string> keys;
};
/// Answered wait_stop_waiting (u8) once every key exists; no server deadline.
struct wait_query {
  static constexpr query_kind kind = query_kind::wait;
  std::vector<std::string> keys;
};
/// Answered with the number of keys (i64).
struct num_keys_query {
  static constexpr query_kind kind = query_kind::num_keys;
};
/// Answered 1 if the key existed, else 0 (i64).
struct delete_key_query {
  static constexpr query_kind kind = query_kind::delete_key;
  std::string key;
};
/// 2.x. No response.
struct append_query {
  static constexpr query_kind kind = query_kind::append;
  std::string key;
  std::string value;
};
/// 2.x. Answered with each value (bytes; empty when missing).
struct multi_get_query {
  static constexpr query_kind kind = query_kind::multi_get;
  std::vector<std::string> keys;
};
/// 2.x: a u64 count, then key and value pairs. No response.
struct multi_set_query {
  static constexpr query_kind kind = query_kind::multi_set;
  std::vector<std::string> keys;
  std::vector<std::string> values;
};
/// 2.x. Ends the connection's pending waits; answered wait_canceled (u8).
struct cancel_wait_query {
  static constexpr query_kind kind = query_kind::cancel_wait;
};
/// 2.x. No response.
struct queue_push_query {
  static constexpr query_kind kind = query_kind::queue_push;
  std::string key;
  std::string value;
};
/// 2.x. Answered with the length before the pop (i64), then the value (bytes) if there was one.
struct queue_pop_query {
  static constexpr query_kind kind = query_kind::queue_pop;
  std::string key;
};
/// 2.x. Answered with the length (i64).
struct queue_len_query {
  static constexpr query_kind kind = query_kind::queue_len;
  std::string key;
};

using query = std::variant<validate_query, ping_query, set_query, compare_set_query, get_query, add_query,
                           check_query, wait_query, num_keys_query, delete_key_query, append_query, multi_get_query,
                           multi_set_query, cancel_wait_query, queue_push_query, queue_pop_query, queue_len_query>;

/// The protocol a connection speaks, told from its first bytes (2.x opens with
/// VALIDATE, code 0, and its magic; 1.13's code 0 is SET, followed by a u64
/// key length): nullopt until enough bytes are there. Pure.
std::optional<version> detect_version(std::span<const std::uint8_t> input) noexcept;

/// A query decoded from the front of a connection's input, and its size in bytes.
struct decoded_query {
  query q;
  std::size_t size = 0;
};

/// Decodes the query at the front of `input` (what a connection has sent and
/// has not been served yet) in protocol `v`. Returns nullopt while the query
/// is incomplete. Throws protocol_error for an unknown code, for 1.13's
/// WATCH_KEY (not served), and for a length or count over `limits` as soon as
/// it is read (an absurd length is refused before its bytes arrive). Pure (no
/// I/O, no executor); allocates at most about input.size(): this is the
/// fuzzing entry point of the PyTorch TCPStore protocol. `admit_wait`, when
/// given, sees a complete WAIT's keys as views into `input` before they are
/// copied, and may throw to refuse the query (the server checks its wait
/// limits there, so a refused wait never holds copies of its keys).
std::optional<decoded_query>
decode_query(version v, std::span<const std::uint8_t> input, const engine_limits& limits,
             const std::function<void(std::span<const std::string_view>)>& admit_wait = {});

/// Appends the bytes of `q` in protocol `v` to `out`; throws store_error when
/// `v` has no such query (e.g. MULTI_SET in 1.13).
void encode_query(version v, const query& q, std::string& out);

} // namespace corodist::store::detail::torch
