#include "ft/quorum_round.hpp"

#include <corodist/core/error.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <functional>
#include <string>

namespace corodist::ft::detail {

namespace {

using namespace asio::experimental::awaitable_operators;
using std::chrono::milliseconds;
using gone_check = std::function<asio::awaitable<bool>()>;

milliseconds left(const round_setup& ctx) {
  return std::chrono::duration_cast<milliseconds>(ctx.deadline - clock::now());
}

std::string names(const std::vector<const member*>& ms) {
  std::string s;
  for (const auto* m : ms) s += (s.empty() ? "'" : ", '") + m->replica_id + "'";
  return s;
}

asio::awaitable<void> pause(milliseconds d) {
  asio::steady_timer t(co_await asio::this_coro::executor, d);
  co_await t.async_wait(asio::use_awaitable);
}

/// Waits for `key` in slices of the poll interval; between slices asks
/// `gone()` whether what it waits for can no longer come (then nullopt).
asio::awaitable<std::optional<std::string>> await_key(const round_setup& ctx, const std::string& key,
                                                      const gone_check& gone, const std::string& what) {
  for (;;) {
    auto l = left(ctx);
    if (l <= milliseconds(0)) throw timeout_error("ft: " + what + " not decided within the quorum timeout");
    auto slice = std::max(milliseconds(1), std::min(ctx.poll, l));
    bool timed_out = false;
    std::string v;
    try {
      v = co_await ctx.store->get(key, slice);
    } catch (const timeout_error&) {
      timed_out = true;
    }
    if (!timed_out) co_return v;
    if (co_await gone()) co_return std::nullopt;
  }
}

/// Whether `key` exists.
asio::awaitable<bool> exists(const round_setup& ctx, std::string key) {
  std::vector<std::string> keys;
  keys.push_back(std::move(key));
  co_return co_await ctx.store->check(std::move(keys));
}

asio::awaitable<std::vector<std::string>> alive_keys(const round_setup& ctx) {
  co_return co_await ctx.store->list_keys(ctx.keys.alive_dir());
}

/// The value of `key`, or "" when it is missing, in one round trip (a
/// compare_set that creates it empty; appends still work on it).
asio::awaitable<std::string> get_or_empty(const round_setup& ctx, std::string key) {
  co_return co_await ctx.store->compare_set(std::move(key), "", "");
}

/// Proposes the members of round `r`: the previous round's members that
/// arrived (all of them with `all_in`; else it waits until each one has
/// arrived or was lost) and the live replicas asking to join. Proposes
/// nothing while they are fewer than min_replicas (initial_replicas in the
/// job's first round). Returns the round's decision, or nullopt when it
/// proposed nothing. The store operations that do not depend on each
/// other go out together (one round trip each group).
asio::awaitable<std::optional<std::string>> propose(const round_setup& ctx, std::uint64_t r,
                                                    const decided_round& prev, bool all_in) {
  const auto& k = ctx.keys;
  std::vector<member_line> members;
  std::vector<std::string> alive;
  std::string joiners;
  if (all_in) {
    std::vector<std::string> in;
    for (const auto& m : prev.members) in.push_back(k.in(r, m.m.replica_id));
    auto [vals, j, a] = co_await (ctx.store->multi_get(std::move(in), std::max(milliseconds(1), left(ctx))) &&
                                  get_or_empty(ctx, k.joiners(r)) && alive_keys(ctx));
    for (const auto& v : vals) {
      auto l = decode_lines(v, "an arrival");
      members.insert(members.end(), l.begin(), l.end());
    }
    joiners = std::move(j);
    alive = std::move(a);
  } else {
    for (;;) {
      alive = co_await alive_keys(ctx);
      members.clear();
      std::vector<const member*> waiting;
      for (const auto& m : prev.members) {
        auto key = k.in(r, m.m.replica_id);
        if (co_await exists(ctx, key)) {
          auto l = decode_lines(co_await ctx.store->get(key), "an arrival");
          members.insert(members.end(), l.begin(), l.end());
        } else if (is_alive(alive, k, m.m)) {
          waiting.push_back(&m.m);
        }
      }
      if (waiting.empty()) break;
      if (left(ctx) <= milliseconds(0))
        throw timeout_error("ft: round " + std::to_string(r) + ": replicas " + names(waiting) +
                            " neither arrived nor were lost within the quorum timeout");
      co_await pause(ctx.poll);
    }
    joiners = co_await get_or_empty(ctx, k.joiners(r));
  }
  for (auto& j : decode_lines(joiners, "the joiners")) {
    bool known = std::any_of(members.begin(), members.end(),
                             [&](const member_line& m) { return m.m.replica_id == j.m.replica_id; });
    if (known || !is_alive(alive, k, j.m)) continue;
    j.needs_group = true;
    members.push_back(std::move(j));
  }
  if (static_cast<int>(members.size()) < (r == 1 ? ctx.initial_replicas : ctx.min_replicas)) co_return std::nullopt;
  std::sort(members.begin(), members.end(),
            [](const member_line& a, const member_line& b) { return a.m.replica_id < b.m.replica_id; });
  std::string text;
  for (const auto& m : members) text += encode_line(m);
  // Whoever wins, round r is decided once the compare_set is done: the
  // latest round may be set beside it.
  // (compare_set returns the decision, ours or the winner's.)
  co_return co_await (ctx.store->compare_set(k.decision(r), "", text) && ctx.store->set(k.latest(), std::to_string(r)));
}

bool holds(const std::vector<member_line>& ms, const member& m) {
  return std::any_of(ms.begin(), ms.end(), [&](const member_line& l) { return same(l.m, m); });
}

} // namespace

asio::awaitable<decided_round> member_round(const round_setup& ctx, const decided_round& prev, member_line self) {
  const auto& k = ctx.keys;
  const auto r = prev.id + 1;
  const std::int64_t n = co_await (ctx.store->set(k.in(r, self.m.replica_id), encode_line(self)) &&
                                   ctx.store->add(k.count(r), 1));
  std::optional<std::string> v;
  if (n == static_cast<std::int64_t>(prev.members.size())) v = co_await propose(ctx, r, prev, true);
  gone_check lost = [&]() -> asio::awaitable<bool> {
    auto alive = co_await alive_keys(ctx);
    co_return std::any_of(prev.members.begin(), prev.members.end(),
                          [&](const member_line& m) { return !is_alive(alive, k, m.m); });
  };
  while (!v) {
    v = co_await await_key(ctx, k.decision(r), lost, "round " + std::to_string(r));
    if (!v) v = co_await propose(ctx, r, prev, false);
  }
  decided_round d{r, decode_lines(*v, "a decision"), prev.members};
  if (!holds(d.members, self.m))
    throw connection_error("ft: replica '" + self.m.replica_id + "' was left out of round " + std::to_string(r) +
                           ": the others found it lost (restart it to rejoin)");
  co_return d;
}

asio::awaitable<decided_round> join_round(const round_setup& ctx, member_line self) {
  const auto& k = ctx.keys;
  std::uint64_t next = 1;
  for (;;) {
    std::uint64_t latest = 0;
    if (auto text = co_await get_or_empty(ctx, k.latest()); !text.empty()) latest = std::stoull(text);
    const auto r = std::max(next, latest + 1);
    decided_round prev;
    prev.id = r - 1;
    if (r > 1) prev.members = decode_lines(co_await ctx.store->get(k.decision(r - 1)), "a decision");
    if (r - 1 == latest && latest >= next && holds(prev.members, self.m)) {
      // The latest round took this replica in already (an earlier call was
      // cancelled after its line went in): it is a member of that quorum,
      // which the others are forming a group for.
      decided_round d{latest, std::move(prev.members), {}};
      if (latest > 1) d.previous = decode_lines(co_await ctx.store->get(k.decision(latest - 1)), "a decision");
      co_return d;
    }
    self.needs_group = true;
    co_await ctx.store->append(k.joiners(r), encode_line(self));
    // The members of the last round take joiners in; when none of them is
    // left (or there was none), the joiners decide among themselves.
    gone_check orphaned = [&]() -> asio::awaitable<bool> {
      auto alive = co_await alive_keys(ctx);
      co_return std::none_of(prev.members.begin(), prev.members.end(),
                             [&](const member_line& m) { return is_alive(alive, k, m.m); });
    };
    for (;;) {
      auto v = co_await await_key(ctx, k.decision(r), orphaned, "round " + std::to_string(r));
      if (!v) v = co_await propose(ctx, r, prev, false);
      if (!v) continue;
      decided_round d{r, decode_lines(*v, "a decision"), std::move(prev.members)};
      if (holds(d.members, self.m)) co_return d;
      break;
    }
    next = r + 1;
  }
}

asio::awaitable<bool> commit_round(const round_setup& ctx, const decided_round& r, const member& self, bool ok) {
  const auto& k = ctx.keys;
  // One counter carries both the number of votes (low 32 bits) and the
  // number of failures (high bits): the last voter knows the outcome at once.
  // The vote keys say who voted, for the check of lost members below.
  constexpr std::int64_t failure = std::int64_t{1} << 32;
  const std::int64_t total = co_await (ctx.store->set(k.vote(r.id, self.replica_id), ok ? "1" : "0") &&
                                       ctx.store->add(k.votes(r.id), ok ? 1 : 1 + failure));
  if ((total & (failure - 1)) == static_cast<std::int64_t>(r.members.size())) {
    auto decided = co_await ctx.store->compare_set(k.commit(r.id), "", total < failure ? "1" : "0");
    if (r.id > 2) asio::co_spawn(ctx.store->get_executor(), forget_round(ctx.store, k, r.id - 2), asio::detached);
    co_return decided == "1";
  }
  // A member lost before it voted makes the step fail for everyone. One lost
  // after its vote may have been the last voter, lost before it wrote the
  // outcome (its vote reached the store, the count did not reach it): with
  // every vote in, the others write the outcome of the count themselves.
  gone_check lost = [&]() -> asio::awaitable<bool> {
    auto alive = co_await alive_keys(ctx);
    bool voted_and_lost = false;
    for (const auto& m : r.members)
      if (!is_alive(alive, k, m.m)) {
        if (!co_await exists(ctx, k.vote(r.id, m.m.replica_id))) co_return true;
        voted_and_lost = true;
      }
    if (voted_and_lost) {
      const std::int64_t now = co_await ctx.store->add(k.votes(r.id), 0);
      if ((now & (failure - 1)) == static_cast<std::int64_t>(r.members.size()))
        co_await ctx.store->compare_set(k.commit(r.id), "", now < failure ? "1" : "0");
    }
    co_return false; // the outcome, if written, is read next
  };
  for (;;) {
    auto v = co_await await_key(ctx, k.commit(r.id), lost, "the commit of round " + std::to_string(r.id));
    if (v) co_return *v == "1";
    co_await ctx.store->compare_set(k.commit(r.id), "", "0");
  }
}

asio::awaitable<void> forget_round(std::shared_ptr<store::store> store, round_keys keys, std::uint64_t r) {
  try {
    for (auto& key : co_await store->list_keys(keys.round(r))) co_await store->delete_key(std::move(key));
  } catch (const std::exception&) {
    // Best effort: a lost store connection is reported by the next step.
  }
}

} // namespace corodist::ft::detail
