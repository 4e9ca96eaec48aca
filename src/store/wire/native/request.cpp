#include "store/wire/native/request.hpp"

#include <type_traits>

namespace corodist::store::detail {

namespace {

template <typename... F>
struct overloaded : F... {
  using F::operator()...;
};
template <typename... F>
overloaded(F...) -> overloaded<F...>;

std::size_t list_size(const std::vector<std::string>& v) {
  std::size_t n = 4;
  for (auto& s : v)
    n += 4 + s.size();
  return n;
}

} // namespace

op kind_of(const request& r) noexcept {
  return std::visit([](const auto& q) { return std::decay_t<decltype(q)>::kind; }, r);
}

std::optional<std::chrono::milliseconds> wait_of(const request& r) noexcept {
  return std::visit(
      [](const auto& q) -> std::optional<std::chrono::milliseconds> {
        if constexpr (requires { q.timeout; })
          return q.timeout;
        else
          return std::nullopt;
      },
      r);
}

net::bytes encode_request(const request& r) {
  writer w;
  std::visit(overloaded{
                 [&](const set_request& q) { w.reserve(8 + q.key.size() + q.value.size()).str(q.key).str(q.value); },
                 [&](const get_request& q) { w.reserve(12 + q.key.size()).str(q.key).millis(q.timeout); },
                 [&](const add_request& q) { w.reserve(12 + q.key.size()).str(q.key).i64(q.delta); },
                 [&](const compare_set_request& q) {
                   w.reserve(12 + q.key.size() + q.expected.size() + q.desired.size())
                       .str(q.key)
                       .str(q.expected)
                       .str(q.desired);
                 },
                 [&](const delete_key_request& q) { w.str(q.key); },
                 [&](const check_request& q) { w.reserve(list_size(q.keys)).strs(q.keys); },
                 [&](const wait_request& q) { w.reserve(list_size(q.keys) + 8).strs(q.keys).millis(q.timeout); },
                 [&](const num_keys_request&) {},
                 [&](const append_request& q) { w.reserve(8 + q.key.size() + q.value.size()).str(q.key).str(q.value); },
                 [&](const multi_get_request& q) { w.reserve(list_size(q.keys) + 8).strs(q.keys).millis(q.timeout); },
                 [&](const multi_set_request& q) {
                   w.reserve(list_size(q.keys) + list_size(q.values)).strs(q.keys).strs(q.values);
                 },
                 [&](const list_keys_request& q) { w.str(q.prefix); },
                 [&](const watch_request& q) { w.reserve(12 + q.key.size()).str(q.key).u64(q.watch_id); },
                 [&](const unwatch_request& q) { w.u64(q.watch_id); },
                 [&](const set_owned_request& q) {
                   w.reserve(8 + q.key.size() + q.value.size()).str(q.key).str(q.value);
                 },
             },
             r);
  return w.take();
}

std::optional<request> decode_request(std::uint16_t kind, std::span<const std::byte> payload) {
  reader in(payload);
  std::optional<request> r;
  // Braced initialisers evaluate their elements in order: the fields are read as laid out.
  switch (static_cast<op>(kind)) {
  case op::set: r = set_request{in.str(), in.str()}; break;
  case op::get: r = get_request{in.str(), in.millis()}; break;
  case op::add: r = add_request{in.str(), in.i64()}; break;
  case op::compare_set: r = compare_set_request{in.str(), in.str(), in.str()}; break;
  case op::delete_key: r = delete_key_request{in.str()}; break;
  case op::check: r = check_request{in.strs()}; break;
  case op::wait: r = wait_request{in.strs(), in.millis()}; break;
  case op::num_keys: r = num_keys_request{}; break;
  case op::append: r = append_request{in.str(), in.str()}; break;
  case op::multi_get: r = multi_get_request{in.strs(), in.millis()}; break;
  case op::multi_set: r = multi_set_request{in.strs(), in.strs()}; break;
  case op::list_keys: r = list_keys_request{in.str()}; break;
  case op::watch: r = watch_request{in.str(), in.u64()}; break;
  case op::unwatch: r = unwatch_request{in.u64()}; break;
  case op::set_owned: r = set_owned_request{in.str(), in.str()}; break;
  default: return std::nullopt; // op::watch_event included: clients send none
  }
  in.end();
  return r;
}

std::optional<std::vector<std::string_view>> wait_keys_of(std::uint16_t kind, std::span<const std::byte> payload) {
  const auto o = static_cast<op>(kind);
  if (o != op::wait && o != op::multi_get)
    return std::nullopt;
  reader in(payload);
  return in.str_views(); // (the timeout after them is decode_request's to check)
}

net::bytes encode_watch_event(std::uint64_t watch_id, const watch_event& e) {
  return writer()
      .reserve(17 + e.key.size() + e.value.size())
      .u64(watch_id)
      .u8(static_cast<std::uint8_t>(e.type))
      .str(e.key)
      .str(e.value)
      .take();
}

watch_event_frame decode_watch_event(std::span<const std::byte> payload) {
  reader in(payload);
  watch_event_frame f;
  f.watch_id = in.u64();
  const auto type = in.u8();
  if (type > static_cast<std::uint8_t>(watch_event::kind::deleted))
    throw protocol_error("store: a watch event of an unknown type");
  f.event.type = static_cast<watch_event::kind>(type);
  f.event.key = in.str();
  f.event.value = in.str();
  in.end();
  return f;
}

} // namespace corodist::store::detail
