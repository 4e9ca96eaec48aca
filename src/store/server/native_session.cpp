#include "store/server/native_session.hpp"

#include <corodist/core/error.hpp>

#include "core/log.hpp"
#include "net/endpoint_text.hpp"
#include "store/server/heap_trim.hpp"
#include "store/wire/native/reply.hpp"

#include <algorithm>
#include <type_traits>

namespace corodist::store::detail {

namespace {
std::uint16_t code(op o) { return static_cast<std::uint16_t>(o); }
} // namespace

void native_session::closed() {
  engine_.drop_owner(id_); // its waits and watches go with it
  watches_.reset();
  trim_heap_after(largest_request_);
}

void native_session::close() {
  if (auto c = conn_.lock())
    c->close();
}

void native_session::handle(const std::shared_ptr<net::connection>& conn, net::message&& m) {
  const auto kind = m.header.kind;
  const auto rid = m.header.request_id;
  largest_request_ = std::max(largest_request_, m.payload.size());
  if (m.header.flags & net::frame_flags::one_way)
    return; // clients send none
  std::optional<request> r;
  try {
    // A wait over this connection's limits is refused while its keys are
    // still views into the frame: their copies would outlive the refusal as
    // heap the allocator keeps.
    if (auto keys = wait_keys_of(kind, m.payload)) {
      try {
        engine_.admit_wait(*keys, id_);
      } catch (const store_error& e) {
        conn->respond(rid, kind, failed_reply(status::error, e.what()));
        return;
      }
    }
    r = decode_request(kind, m.payload);
  } catch (const protocol_error& e) {
    CORODIST_LOG_WARN("store: malformed request from {}: {}", net::detail::endpoint_text(conn->remote_endpoint()),
                      e.what());
    conn->respond(rid, kind, failed_reply(status::error, std::string("malformed request: ") + e.what()));
    return;
  }
  if (!r) {
    CORODIST_LOG_WARN("store: a request of an unknown operation from {}",
                      net::detail::endpoint_text(conn->remote_endpoint()));
    conn->respond_error(rid, kind, "unknown store operation");
    return;
  }
  try {
    serve(conn, rid, std::move(*r));
  } catch (const std::exception& e) { // over a limit, not an integer, ...: this request fails
    conn->respond(rid, kind, failed_reply(status::error, e.what()));
  }
}

template <typename Answer>
void native_session::answer_when_present(std::uint64_t rid, op kind, std::vector<std::string> keys,
                                         std::chrono::milliseconds timeout, Answer answer) {
  // The engine calls `done` itself, so it is alive then.
  engine_.wait(std::move(keys), timeout, id_,
               [conn = conn_, eng = &engine_, rid, kind, timeout,
                answer = std::move(answer)](std::vector<std::string>&& keys,
                                            std::vector<std::string>&& missing) mutable {
                 auto c = conn.lock();
                 if (!c)
                   return;
                 if (!missing.empty())
                   c->respond(rid, code(kind), failed_reply(status::timeout, rules::timeout_message(missing, timeout)));
                 else
                   c->respond(rid, code(kind), answer(*eng, keys));
               });
}

void native_session::serve(const std::shared_ptr<net::connection>& conn, std::uint64_t rid, request&& r) {
  const auto kind = code(kind_of(r));
  auto ok = [&](writer&& w) { conn->respond(rid, kind, w.take()); };
  auto& eng = engine_;
  std::visit(
      [&](auto&& q) {
        using Q = std::decay_t<decltype(q)>;
        if constexpr (std::is_same_v<Q, set_request>) {
          eng.set(std::move(q.key), std::move(q.value));
          ok(ok_reply());
        } else if constexpr (std::is_same_v<Q, set_owned_request>) {
          eng.set_owned(std::move(q.key), std::move(q.value), id_);
          ok(ok_reply());
        } else if constexpr (std::is_same_v<Q, get_request>) {
          if (auto* v = eng.get(q.key)) // present: answered without registering a wait
            return ok(std::move(ok_reply().reserve(4 + v->size()).str(*v)));
          std::vector<std::string> keys{std::move(q.key)};
          answer_when_present(rid, Q::kind, std::move(keys), q.timeout, [](engine& e, const std::vector<std::string>& k) {
            auto* v = e.get(k[0]); // (deleted since: an empty value, as PyTorch's GET)
            return ok_reply().str(v ? *v : std::string()).take();
          });
        } else if constexpr (std::is_same_v<Q, add_request>) {
          ok(std::move(ok_reply().i64(eng.add(q.key, q.delta))));
        } else if constexpr (std::is_same_v<Q, compare_set_request>) {
          ok(std::move(ok_reply().str(eng.compare_set(q.key, q.expected, std::move(q.desired)))));
        } else if constexpr (std::is_same_v<Q, delete_key_request>) {
          ok(std::move(ok_reply().u8(eng.erase(q.key) ? 1 : 0)));
        } else if constexpr (std::is_same_v<Q, check_request>) {
          ok(std::move(ok_reply().u8(eng.check(q.keys) ? 1 : 0)));
        } else if constexpr (std::is_same_v<Q, wait_request>) {
          answer_when_present(rid, Q::kind, std::move(q.keys), q.timeout,
                              [](engine&, const std::vector<std::string>&) { return ok_reply().take(); });
        } else if constexpr (std::is_same_v<Q, num_keys_request>) {
          ok(std::move(ok_reply().i64(static_cast<std::int64_t>(eng.size()))));
        } else if constexpr (std::is_same_v<Q, append_request>) {
          eng.append(q.key, q.value);
          ok(ok_reply());
        } else if constexpr (std::is_same_v<Q, multi_get_request>) {
          answer_when_present(rid, Q::kind, std::move(q.keys), q.timeout,
                              [](engine& e, const std::vector<std::string>& k) {
                                return ok_reply().strs(e.values(k)).take();
                              });
        } else if constexpr (std::is_same_v<Q, multi_set_request>) {
          eng.multi_set(std::move(q.keys), std::move(q.values));
          ok(ok_reply());
        } else if constexpr (std::is_same_v<Q, list_keys_request>) {
          ok(std::move(ok_reply().strs(eng.list(q.prefix))));
        } else if constexpr (std::is_same_v<Q, watch_request>) {
          auto id = eng.watch(q.key, id_, [w = conn_, client_id = q.watch_id](const watch_event& e) {
            if (auto c = w.lock())
              c->send(code(op::watch_event), encode_watch_event(client_id, e));
          });
          if (!watches_)
            watches_ = std::make_unique<std::unordered_map<std::uint64_t, std::uint64_t>>();
          if (auto old = watches_->find(q.watch_id); old != watches_->end()) // an id used again replaces its watch
            eng.unwatch(old->second);
          (*watches_)[q.watch_id] = id;
          ok(ok_reply());
        } else if constexpr (std::is_same_v<Q, unwatch_request>) {
          if (watches_)
            if (auto it = watches_->find(q.watch_id); it != watches_->end()) {
              eng.unwatch(it->second);
              watches_->erase(it);
            }
          ok(ok_reply());
        } else {
          static_assert(!sizeof(Q), "every request is served");
        }
      },
      r);
}

} // namespace corodist::store::detail
