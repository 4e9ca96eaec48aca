#include "store/wire/torch/query.hpp"

#include <cstring>
#include <type_traits>

namespace corodist::store::detail::torch {

std::optional<version> detect_version(std::span<const std::uint8_t> input) noexcept {
  if (input.empty())
    return std::nullopt;
  if (input[0] != 0)
    return version::v1;
  if (input.size() < 5)
    return std::nullopt;
  std::uint32_t magic = 0;
  std::memcpy(&magic, input.data() + 1, 4);
  return magic == validate_magic ? version::v2 : version::v1;
}

std::optional<decoded_query>
decode_query(version v, std::span<const std::uint8_t> input, const engine_limits& limits,
             const std::function<void(std::span<const std::string_view>)>& admit_wait) {
  cursor in(input.data(), input.size());
  std::uint8_t code = 0;
  if (!in.u8(code))
    return std::nullopt;
  const auto kind = kind_of_code(v, code);
  if (!kind)
    throw protocol_error(std::string("unknown PyTorch ") + version_name(v) + " TCPStore query code " +
                         std::to_string(code));
  const auto max_key = limits.max_key_size;
  const auto max_value = limits.max_value_size;
  const auto max_keys = limits.max_keys_per_request;
  auto whole = [&](auto&& q) { return std::optional<decoded_query>(decoded_query{std::move(q), in.consumed()}); };
  auto key_value = [&](auto q) -> std::optional<decoded_query> {
    if (!in.bytes(q.key, max_key, "key") || !in.bytes(q.value, max_value, "value"))
      return std::nullopt;
    return whole(std::move(q));
  };
  auto key_only = [&](auto q) -> std::optional<decoded_query> {
    if (!in.bytes(q.key, max_key, "key"))
      return std::nullopt;
    return whole(std::move(q));
  };
  auto key_list = [&](auto q) -> std::optional<decoded_query> {
    if (!in.keys(q.keys, max_keys, max_key))
      return std::nullopt;
    return whole(std::move(q));
  };
  switch (*kind) {
  case query_kind::validate: {
    validate_query q;
    if (!in.u32(q.magic))
      return std::nullopt;
    if (q.magic != validate_magic)
      throw protocol_error("bad VALIDATE magic");
    return whole(q);
  }
  case query_kind::ping: {
    ping_query q;
    if (!in.u32(q.nonce))
      return std::nullopt;
    return whole(q);
  }
  case query_kind::set: return key_value(set_query{});
  case query_kind::append: return key_value(append_query{});
  case query_kind::queue_push: return key_value(queue_push_query{});
  case query_kind::compare_set: {
    compare_set_query q;
    if (!in.bytes(q.key, max_key, "key") || !in.bytes(q.expected, max_value, "value") ||
        !in.bytes(q.desired, max_value, "value"))
      return std::nullopt;
    return whole(std::move(q));
  }
  case query_kind::get: return key_only(get_query{});
  case query_kind::delete_key: return key_only(delete_key_query{});
  case query_kind::queue_pop: return key_only(queue_pop_query{});
  case query_kind::queue_len: return key_only(queue_len_query{});
  case query_kind::add: {
    add_query q;
    if (!in.bytes(q.key, max_key, "key") || !in.i64(q.delta))
      return std::nullopt;
    return whole(std::move(q));
  }
  case query_kind::check: return key_list(check_query{});
  case query_kind::wait: {
    if (admit_wait) {
      cursor scan = in;
      std::vector<std::string_view> views;
      if (!scan.keys(views, max_keys, max_key))
        return std::nullopt;
      admit_wait(views);
    }
    return key_list(wait_query{});
  }
  case query_kind::multi_get: return key_list(multi_get_query{});
  case query_kind::num_keys: return whole(num_keys_query{});
  case query_kind::cancel_wait: return whole(cancel_wait_query{});
  case query_kind::multi_set: {
    std::uint64_t n = 0;
    if (!in.u64(n))
      return std::nullopt;
    if (n > max_keys)
      throw protocol_error(std::to_string(n) + " keys in one query exceed the limit of " + std::to_string(max_keys));
    cursor scan = in; // all there? (without copying: see cursor::keys)
    for (std::uint64_t i = 0; i < n; ++i)
      if (!scan.skip(max_key, "key") || !scan.skip(max_value, "value"))
        return std::nullopt;
    multi_set_query q;
    q.keys.resize(n);
    q.values.resize(n);
    for (std::uint64_t i = 0; i < n; ++i)
      if (!in.bytes(q.keys[i], max_key, "key") || !in.bytes(q.values[i], max_value, "value"))
        return std::nullopt;
    return whole(std::move(q));
  }
  case query_kind::watch_key: // 1.13's callback registration; no Python API uses it
    throw protocol_error("PyTorch 1.13 TCPStore query WATCH_KEY is not supported");
  }
  return std::nullopt; // unreachable: every kind is handled above
}

void encode_query(version v, const query& q, std::string& out) {
  std::visit(
      [&](const auto& x) {
        using Q = std::decay_t<decltype(x)>;
        encoder e(out);
        e.u8(code_of(v, Q::kind));
        if constexpr (std::is_same_v<Q, validate_query>)
          e.u32(x.magic);
        else if constexpr (std::is_same_v<Q, ping_query>)
          e.u32(x.nonce);
        else if constexpr (std::is_same_v<Q, set_query> || std::is_same_v<Q, append_query> ||
                           std::is_same_v<Q, queue_push_query>)
          e.bytes(x.key).bytes(x.value);
        else if constexpr (std::is_same_v<Q, compare_set_query>)
          e.bytes(x.key).bytes(x.expected).bytes(x.desired);
        else if constexpr (std::is_same_v<Q, get_query> || std::is_same_v<Q, delete_key_query> ||
                           std::is_same_v<Q, queue_pop_query> || std::is_same_v<Q, queue_len_query>)
          e.bytes(x.key);
        else if constexpr (std::is_same_v<Q, add_query>)
          e.bytes(x.key).i64(x.delta);
        else if constexpr (std::is_same_v<Q, check_query> || std::is_same_v<Q, wait_query> ||
                           std::is_same_v<Q, multi_get_query>)
          e.keys(x.keys);
        else if constexpr (std::is_same_v<Q, multi_set_query>) {
          rules::check_multi_set(x.keys, x.values);
          e.u64(x.keys.size());
          for (std::size_t i = 0; i < x.keys.size(); ++i)
            e.bytes(x.keys[i]).bytes(x.values[i]);
        } else
          static_assert(std::is_same_v<Q, num_keys_query> || std::is_same_v<Q, cancel_wait_query>,
                        "every query is encoded");
      },
      q);
}

} // namespace corodist::store::detail::torch
