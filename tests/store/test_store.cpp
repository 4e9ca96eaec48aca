#define BOOST_TEST_MODULE corodist_store
#include <boost/mpl/list.hpp>
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/future.hpp>
#include <corodist/store/sync_store.hpp>

#include "store/server/engine.hpp"
#include "store/log_capture.hpp"
#include "store/wire/native/reply.hpp"
#include "store/wire/native/request.hpp"
#include "store/store_fixtures.hpp"
#include "store/wire/torch/query.hpp"
#include "store/wait_log.hpp"
#include "support/child_process.hpp"
#include "support/coro_test.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <future>
#include <limits>
#include <thread>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cs = corodist::store;
using corodist::test::run_coro;
using impls = boost::mpl::list<corodist::test::hash_impl, corodist::test::file_impl, corodist::test::tcp_impl,
                               corodist::test::prefix_impl>;

namespace {
template <typename E, typename F>
asio::awaitable<std::string> expect_throw(F f) {
  try {
    co_await f();
  } catch (const E& e) {
    co_return std::string(e.what());
  } catch (const std::exception& e) {
    co_return std::string("WRONG EXCEPTION: ") + e.what();
  }
  co_return std::string("NO EXCEPTION");
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
} // namespace

BOOST_AUTO_TEST_SUITE(common)

BOOST_AUTO_TEST_CASE_TEMPLATE(set_get_overwrite_binary, Impl, impls) {
  Impl impl;
  auto s = impl.make();
  asio::io_context ctx;
  run_coro(ctx, [&]() -> asio::awaitable<void> {
    co_await s->set("a", "1");
    auto v = co_await s->get("a");
    BOOST_TEST(v == "1");
    std::string bin("x\0y\xff", 4);
    co_await s->set("a", bin);
    v = co_await s->get("a");
    BOOST_TEST((v == bin));
    co_await s->set("", "empty key");
    v = co_await s->get("");
    BOOST_TEST(v == "empty key");
    co_await s->set("big", std::string(1 << 20, 'z'));
    v = co_await s->get("big");
    BOOST_TEST(v.size() == std::size_t(1 << 20));
  }());
}

// The get is pending before the set (a round trip through the same store
// after it has come back: the server answers a connection's requests in
// order, and the in-process stores register a wait before they first
// suspend); it completes with the value once the set comes.
BOOST_AUTO_TEST_CASE_TEMPLATE(get_waits_for_a_later_set, Impl, impls) {
  Impl impl;
  auto s = impl.make();
  auto setter = impl.make();
  asio::io_context ctx;
  run_coro(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    corodist::promise<std::string> p;
    auto got = p.get_future();
    asio::co_spawn(ex, s->get("late"), [&p](std::exception_ptr e, std::string v) {
      if (e)
        p.set_exception(e);
      else
        p.set_value(std::move(v));
    });
    co_await asio::post(ex, asio::use_awaitable); // the get has started
    std::vector<std::string> keys{"late"};
    BOOST_TEST(!co_await s->check(std::move(keys))); // and is pending behind this
    BOOST_TEST(!got.is_ready());
    co_await setter->set("late", "here");
    BOOST_TEST(co_await got.async_get() == "here");
  }());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(wait_and_get_time_out, Impl, impls) {
  Impl impl;
  auto s = impl.make();
  asio::io_context ctx;
  run_coro(ctx, [&]() -> asio::awaitable<void> {
    co_await s->set("present", "1");
    auto t0 = std::chrono::steady_clock::now();
    auto what = co_await expect_throw<corodist::timeout_error>([&]() -> asio::awaitable<void> {
      std::vector<std::string> keys{"present", "absent"};
      co_await s->wait(std::move(keys), 60ms);
    });
    auto took = std::chrono::steady_clock::now() - t0;
    BOOST_TEST(contains(what, "absent"), what);
    BOOST_TEST(!contains(what, "present"), what);
    // The time the wait was given: the deadline's length less what passed
    // before the wait began (a client sends the time remaining).
    const auto after = what.find("timed out after ");
    BOOST_TEST_REQUIRE(after != std::string::npos, what);
    const int given = std::stoi(what.substr(after + 16));
    BOOST_TEST((given > 0 && given <= 60), what);
    BOOST_CHECK(took >= 55ms); // (how far past: bench/store_suite.cpp, wait_timeout_overrun)
    s->set_timeout(40ms);
    what = co_await expect_throw<corodist::timeout_error>([&]() -> asio::awaitable<void> { (void)co_await s->get("nope"); });
    BOOST_TEST(contains(what, "nope"), what);
    what = co_await expect_throw<corodist::timeout_error>(
        [&]() -> asio::awaitable<void> { (void)co_await s->get("nope2", 30ms); });
    BOOST_TEST(contains(what, "nope2"), what);
    // The store keeps working after timeouts.
    co_await s->set("after", "ok");
    auto v = co_await s->get("after");
    BOOST_TEST(v == "ok");
  }());
}

// A zero time limit is a deadline already passed: the call fails at once with
// timeout_error, before anything is sent, even for a key that is there (it is
// not "wait forever"); never() waits until the key comes; inherit() is the
// store's timeout.
BOOST_AUTO_TEST_CASE_TEMPLATE(a_passed_deadline_fails_at_once_and_never_waits_on, Impl, impls) {
  Impl impl;
  auto s = impl.make();
  asio::io_context ctx;
  run_coro(ctx, [&]() -> asio::awaitable<void> {
    co_await s->set("here", "1");
    auto what = co_await expect_throw<corodist::timeout_error>(
        [&]() -> asio::awaitable<void> { (void)co_await s->get("here", 0ms); });
    BOOST_TEST(contains(what, "deadline had passed"), what);
    (void)co_await expect_throw<corodist::timeout_error>([&]() -> asio::awaitable<void> {
      std::vector<std::string> keys{"here"};
      co_await s->wait(std::move(keys), -1s);
    });
    (void)co_await expect_throw<corodist::timeout_error>(
        [&]() -> asio::awaitable<void> { co_await s->barrier("b0", 2, 0ms); });
    BOOST_TEST(co_await s->add("b0/count", 0) == 0); // the barrier did not arrive: nothing was sent
    // never(): waits as long as it takes (here: until this coroutine sets the key).
    corodist::promise<std::string> got;
    auto later = got.get_future();
    asio::co_spawn(
        co_await asio::this_coro::executor,
        [&]() -> asio::awaitable<void> { got.set_value(co_await s->get("later", corodist::timeout::never())); },
        asio::detached);
    co_await s->set("later", "2");
    BOOST_TEST(co_await later.async_get() == "2");
    s->set_timeout(corodist::timeout::inherit()); // back to the default
    BOOST_TEST(s->timeout() == cs::default_timeout);
  }());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(add_counts_as_decimal_text, Impl, impls) {
  Impl impl;
  auto s = impl.make();
  asio::io_context ctx;
  run_coro(ctx, [&]() -> asio::awaitable<void> {
    auto n = co_await s->add("c", 5);
    BOOST_TEST(n == 5);
    n = co_await s->add("c", -7);
    BOOST_TEST(n == -2);
    auto text = co_await s->get("c");
    BOOST_TEST(text == "-2"); // c10d stores counters as decimal strings
    co_await s->set("t", "41");
    n = co_await s->add("t", 1);
    BOOST_TEST(n == 42);
    co_await s->set("word", "hello");
    auto what = co_await expect_throw<corodist::store::store_error>(
        [&]() -> asio::awaitable<void> { (void)co_await s->add("word", 1); });
    BOOST_TEST(contains(what, "word"), what);
    auto still = co_await s->get("word");
    BOOST_TEST(still == "hello");
    // An add that would overflow fails and changes nothing, in every store.
    co_await s->set("big", std::to_string(std::numeric_limits<std::int64_t>::max() - 1));
    n = co_await s->add("big", 1);
    BOOST_TEST(n == std::numeric_limits<std::int64_t>::max());
    what = co_await expect_throw<corodist::store::store_error>([&]() -> asio::awaitable<void> { (void)co_await s->add("big", 1); });
    BOOST_TEST(contains(what, "overflows"), what);
    auto big = co_await s->get("big");
    BOOST_TEST(big == std::to_string(std::numeric_limits<std::int64_t>::max()));
  }());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(compare_set_edge_cases, Impl, impls) {
  Impl impl;
  auto s = impl.make();
  asio::io_context ctx;
  run_coro(ctx, [&]() -> asio::awaitable<void> {
    // Missing key, non-empty expected: returns expected, stores nothing.
    auto r = co_await s->compare_set("k", "x", "y");
    BOOST_TEST(r == "x");
    std::vector<std::string> keys{"k"};
    bool exists = co_await s->check(keys);
    BOOST_TEST(!exists);
    // Missing key, empty expected: creates it.
    r = co_await s->compare_set("k", "", "first");
    BOOST_TEST(r == "first");
    // Mismatch: returns the current value unchanged.
    r = co_await s->compare_set("k", "wrong", "second");
    BOOST_TEST(r == "first");
    // Match: swaps.
    r = co_await s->compare_set("k", "first", "second");
    BOOST_TEST(r == "second");
    auto v = co_await s->get("k");
    BOOST_TEST(v == "second");
    // Existing empty value matches an empty expected.
    co_await s->set("e", "");
    r = co_await s->compare_set("e", "", "filled");
    BOOST_TEST(r == "filled");
  }());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(delete_check_count_list_append_multi, Impl, impls) {
  Impl impl;
  auto s = impl.make();
  asio::io_context ctx;
  run_coro(ctx, [&]() -> asio::awaitable<void> {
    auto base = co_await s->num_keys();
    co_await s->set("x/1", "a");
    co_await s->set("x/2", "b");
    co_await s->set("y", "c");
    auto n = co_await s->num_keys();
    BOOST_TEST(n == base + 3);
    std::vector<std::string> both{"x/1", "y"};
    bool ok = co_await s->check(both);
    BOOST_TEST(ok);
    auto listed = co_await s->list_keys("x/");
    BOOST_TEST((listed == std::vector<std::string>{"x/1", "x/2"}));
    bool deleted = co_await s->delete_key("y");
    BOOST_TEST(deleted);
    deleted = co_await s->delete_key("y");
    BOOST_TEST(!deleted);
    ok = co_await s->check(both);
    BOOST_TEST(!ok);
    co_await s->append("log", "ab");
    co_await s->append("log", "cd");
    auto log = co_await s->get("log");
    BOOST_TEST(log == "abcd");
    std::vector<std::string> ks{"m1", "m2", "m3"}, vs{"v1", "v2", "v3"};
    co_await s->multi_set(ks, vs);
    auto got = co_await s->multi_get(ks);
    BOOST_TEST((got == vs));
    std::vector<std::string> one{"m1"};
    auto what = co_await expect_throw<corodist::store::store_error>([&]() -> asio::awaitable<void> {
      std::vector<std::string> two{"a", "b"};
      co_await s->multi_set(one, two);
    });
    BOOST_TEST(contains(what, "multi_set"), what);
  }());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(watch_events_in_order, Impl, impls) {
  Impl impl;
  auto s = impl.make();
  auto other = impl.make();
  asio::io_context ctx;
  run_coro(ctx, [&]() -> asio::awaitable<void> {
    auto w = co_await s->watch_key("w");
    co_await other->set("unrelated", "1");
    co_await other->set("w", "1");
    co_await other->set("w", "2");
    co_await other->append("w", "3");
    (void)co_await other->add("unrelated", 1);
    bool deleted = co_await other->delete_key("w");
    BOOST_TEST(deleted);
    co_await other->set("w", "4");
    using kind = cs::watch_event::kind;
    const std::vector<std::pair<kind, std::string>> expect{
        {kind::created, "1"}, {kind::updated, "2"}, {kind::updated, "23"}, {kind::deleted, ""}, {kind::created, "4"}};
    for (auto& [k, v] : expect) {
      auto e = co_await w.next(5s);
      BOOST_TEST(e.key == "w");
      BOOST_TEST(to_string(e.type) == to_string(k));
      BOOST_TEST(e.value == v);
    }
    auto what = co_await expect_throw<corodist::timeout_error>(
        [&]() -> asio::awaitable<void> { (void)co_await w.next(50ms); });
    BOOST_TEST(contains(what, "no event"), what);
    w.close();
    co_await other->set("w", "5"); // no one listens: must not disturb anything
    auto v = co_await s->get("w");
    BOOST_TEST(v == "5");
  }());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(barrier_and_blocking_facade_from_threads, Impl, impls) {
  Impl impl;
  constexpr int n = 4;
  std::vector<std::thread> threads;
  std::atomic<int> passed{0};
  std::vector<std::shared_ptr<cs::store>> stores;
  for (int i = 0; i < n; ++i)
    stores.push_back(impl.make());
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      cs::sync_store s(stores[i]);
      s.set("rank/" + std::to_string(i), std::to_string(i));
      s.barrier("b0", n);
      // Everyone's key is visible once the barrier is passed.
      std::vector<std::string> keys;
      for (int r = 0; r < n; ++r)
        keys.push_back("rank/" + std::to_string(r));
      if (s.check(keys) && s.add("after", 1) > 0)
        ++passed;
    });
  for (auto& t : threads)
    t.join();
  BOOST_TEST(passed.load() == n);
  cs::sync_store s(stores[0]);
  BOOST_TEST(s.get("after") == std::to_string(n));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(blocking_facade_refuses_the_loop_thread, Impl, impls) {
  Impl impl;
  auto s = impl.make();
  std::promise<bool> threw;
  asio::post(impl.loop.get_executor(), [&] {
    try {
      cs::sync_store(s).get("k", 10ms);
      threw.set_value(false);
    } catch (const corodist::usage_error&) {
      threw.set_value(true);
    } catch (...) {
      threw.set_value(false);
    }
  });
  BOOST_TEST(threw.get_future().get());
}

BOOST_AUTO_TEST_SUITE_END()

// The server's state machine directly: removing waiters costs what each owner
// holds. 240,000 waits on one key from 60 owners, then every owner drops: the
// per-key list used to be a vector searched per removal (quadratic: a 10 s
// freeze at this size), now each removal is a set erase. The key then still
// completes a fresh wait, and nothing is left held.
BOOST_AUTO_TEST_CASE(dropping_many_waiters_on_one_key, *utf::timeout(60)) {
  asio::io_context ctx;
  auto state = std::make_shared<cs::detail::engine>(ctx.get_executor());
  constexpr int owners = 60, per_owner = 4096;
  int completed = 0;
  for (int o = 1; o <= owners; ++o)
    for (int i = 0; i < per_owner; ++i)
      state->wait({"k"}, 0ms, static_cast<cs::detail::engine::owner_id>(o),
                  [&](std::vector<std::string>&&, std::vector<std::string>&&) { ++completed; });
  BOOST_TEST(state->pending_waits(1) == std::size_t(per_owner));
  BOOST_TEST(state->wait_bytes() > 0u);
  for (int o = 1; o <= owners; ++o)
    state->drop_owner(static_cast<cs::detail::engine::owner_id>(o));
  BOOST_TEST(state->wait_bytes() == 0u);
  BOOST_TEST(completed == 0); // dropped, not completed
  std::vector<std::string> got;
  state->wait({"k", "j"}, 0ms, 99, [&](std::vector<std::string>&& keys, std::vector<std::string>&& missing) {
    got = keys;
    BOOST_TEST(missing.empty());
  });
  state->set("j", "1");
  state->set("k", "2");
  BOOST_TEST((got == std::vector<std::string>{"k", "j"}));
  BOOST_TEST(state->wait_bytes() == 0u);
}

// Pushes complete one waiter each, oldest first, however many wait.
BOOST_AUTO_TEST_CASE(queue_push_wakes_waiters_in_order, *utf::timeout(30)) {
  asio::io_context ctx;
  auto state = std::make_shared<cs::detail::engine>(ctx.get_executor());
  std::vector<int> order;
  for (int i = 0; i < 5; ++i)
    state->wait({"q"}, 0ms, 1, [&, i](std::vector<std::string>&&, std::vector<std::string>&&) { order.push_back(i); });
  state->queue_push("q", "a");
  state->queue_push("q", "b");
  BOOST_TEST((order == std::vector<int>{0, 1}));
  BOOST_TEST(state->pending_waits(1) == 3u);
}

// The engine's limits: over one, an operation throws store_error naming the
// limit and changes nothing (all of a multi_set is checked before any is set).
BOOST_AUTO_TEST_CASE(engine_limits_refuse_without_changing_anything, *utf::timeout(30)) {
  asio::io_context ctx;
  cs::detail::engine_limits limits;
  limits.max_key_size = 4;
  limits.max_value_size = 8;
  limits.max_keys_per_request = 2;
  limits.max_waits_per_owner = 1;
  auto eng = std::make_shared<cs::detail::engine>(ctx.get_executor(), limits);
  auto fails = [](auto&& f, const std::string& part) {
    try {
      f();
    } catch (const corodist::store::store_error& e) {
      BOOST_TEST(contains(e.what(), part), e.what());
      return true;
    }
    return false;
  };
  BOOST_TEST(fails([&] { eng->set("toolong", "v"); }, "max_key_size"));
  BOOST_TEST(fails([&] { eng->set("k", "123456789"); }, "max_value_size"));
  BOOST_TEST(eng->size() == 0u);
  eng->set("k", "1234");
  BOOST_TEST(fails([&] { eng->append("k", "56789"); }, "max_value_size"));
  BOOST_TEST(*eng->get("k") == "1234");
  BOOST_TEST(fails([&] { eng->compare_set("k", "1234", "123456789"); }, "max_value_size"));
  BOOST_TEST(fails([&] { eng->multi_set({"a", "b"}, {"1", "123456789"}); }, "max_value_size"));
  BOOST_TEST(fails([&] { eng->multi_set({"a", "b"}, {"1"}); }, "multi_set"));
  BOOST_TEST(eng->get("a") == nullptr);
  BOOST_TEST(fails([&] { eng->check({"a", "b", "c"}); }, "too many keys"));
  BOOST_TEST(fails([&] { eng->wait({"a", "b", "c"}, 0ms, 1, [](auto&&, auto&&) {}); }, "too many keys"));
  BOOST_TEST(fails([&] { eng->watch("toolong", 1, [](const cs::watch_event&) {}); }, "max_key_size"));
  eng->wait({"a"}, 0ms, 1, [](auto&&, auto&&) {});
  BOOST_TEST(fails([&] { eng->wait({"b"}, 0ms, 1, [](auto&&, auto&&) {}); }, "too many pending waits"));
  BOOST_TEST(eng->pending_waits() == 1u);
  BOOST_TEST(fails([&] { eng->add("k", std::numeric_limits<std::int64_t>::max()); }, "overflows"));
  BOOST_TEST(*eng->get("k") == "1234");
}

// Owned keys in the engine: dropping the owner deletes what it still owns
// (watchers see `deleted`, a waiter on the key waits on); any later write by
// someone else (set, set_owned, add, append, compare_set, delete) takes the
// ownership away; owner 0 (in-process) owns nothing.
BOOST_AUTO_TEST_CASE(engine_owned_keys, *utf::timeout(30)) {
  asio::io_context ctx;
  auto eng = std::make_shared<cs::detail::engine>(ctx.get_executor());
  std::vector<std::string> events;
  eng->watch("a", 9, [&](const cs::watch_event& e) { events.push_back(std::string(cs::to_string(e.type)) + " " + e.key); });
  eng->set_owned("a", "1", 1);
  eng->set_owned("b", "1", 1);
  eng->set_owned("c", "1", 1);
  eng->set_owned("d", "1", 1);
  eng->set_owned("e", "1", 1);
  eng->set_owned("f", "1", 0);
  BOOST_TEST(eng->owner_of("a") == 1u);
  BOOST_TEST(eng->owner_of("f") == 0u);
  eng->set("b", "2");            // taken over by a plain set
  eng->set_owned("c", "2", 2);   // moved to owner 2
  eng->add("d", 0);              // (the value "1" is an integer)
  eng->compare_set("e", "1", "3");
  eng->drop_owner(3);            // owns nothing: nothing happens
  BOOST_TEST(eng->size() == 6u);
  bool woke = false;
  eng->drop_owner(1);
  BOOST_TEST(eng->get("a") == nullptr);
  for (auto k : {"b", "c", "d", "e", "f"})
    BOOST_TEST(eng->get(k) != nullptr, k);
  BOOST_TEST((events == std::vector<std::string>{"created a", "deleted a"}));
  eng->wait({"c"}, 0ms, 5, [&](std::vector<std::string>&&, std::vector<std::string>&& missing) {
    woke = missing.empty();
  });
  BOOST_TEST(woke); // c exists: at once
  woke = false;
  eng->drop_owner(2);
  BOOST_TEST(eng->get("c") == nullptr);
  eng->wait({"c"}, 0ms, 5, [&](std::vector<std::string>&&, std::vector<std::string>&& missing) {
    woke = missing.empty();
  });
  BOOST_TEST(!woke); // waits on after the deletion
  eng->set("c", "back");
  BOOST_TEST(woke);
  eng->set_owned("g", "1", 4);
  BOOST_TEST(eng->erase("g"));
  eng->set("g", "plain");
  eng->drop_owner(4); // the delete took the ownership: the new g stays
  BOOST_TEST(*eng->get("g") == "plain");
}

// A wait that names a key twice completes when the key is set.
BOOST_AUTO_TEST_CASE(wait_naming_a_key_twice_completes, *utf::timeout(30)) {
  asio::io_context ctx;
  auto eng = std::make_shared<cs::detail::engine>(ctx.get_executor());
  bool done = false;
  eng->wait({"k", "k"}, 0ms, 1, [&](std::vector<std::string>&&, std::vector<std::string>&& missing) {
    done = missing.empty();
  });
  eng->set("k", "v");
  BOOST_TEST(done);
  BOOST_TEST(eng->pending_waits() == 0u);
}

BOOST_AUTO_TEST_SUITE(wire)

namespace {
std::span<const std::byte> as_bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }
} // namespace

// Native requests: decoding what was encoded gives the same request; a
// truncated payload, extra bytes or a count the bytes cannot hold are
// refused with protocol_error (nothing large is allocated); an unknown kind
// is no request.
BOOST_AUTO_TEST_CASE(native_requests_decode_what_was_encoded, *utf::timeout(30)) {
  namespace d = cs::detail;
  const std::vector<d::request> all{
      d::set_request{"k", std::string("v\0x", 3)},
      d::get_request{"k", 1500ms},
      d::add_request{"c", -7},
      d::compare_set_request{"k", "", "new"},
      d::delete_key_request{"k"},
      d::check_request{{"a", "b"}},
      d::wait_request{{"a"}, 0ms},
      d::num_keys_request{},
      d::append_request{"k", "+"},
      d::multi_get_request{{"a", "b", ""}, 10ms},
      d::multi_set_request{{"a", "b"}, {"1", "2"}},
      d::list_keys_request{"x/"},
      d::watch_request{"w", 42},
      d::unwatch_request{42},
      d::set_owned_request{"lease", "v"},
  };
  for (auto& r : all) {
    const auto bytes = d::encode_request(r);
    auto back = d::decode_request(static_cast<std::uint16_t>(d::kind_of(r)), bytes);
    BOOST_REQUIRE(back);
    BOOST_TEST(back->index() == r.index());
    BOOST_TEST((d::encode_request(*back) == bytes));
    BOOST_TEST((d::wait_of(*back) == d::wait_of(r)));
    if (!bytes.empty()) {
      auto cut = std::span<const std::byte>(bytes).first(bytes.size() - 1);
      BOOST_CHECK_THROW(d::decode_request(static_cast<std::uint16_t>(d::kind_of(r)), cut), corodist::protocol_error);
    }
    auto longer = bytes;
    longer.push_back(std::byte{0});
    BOOST_CHECK_THROW(d::decode_request(static_cast<std::uint16_t>(d::kind_of(r)), longer), corodist::protocol_error);
  }
  BOOST_TEST(!d::decode_request(999, {}));
  BOOST_TEST(!d::decode_request(static_cast<std::uint16_t>(d::op::watch_event), {}));
  // CHECK claiming 4 billion keys in 4 bytes.
  const std::string huge("\xff\xff\xff\xff", 4);
  BOOST_CHECK_THROW(d::decode_request(static_cast<std::uint16_t>(d::op::check), as_bytes(huge)), corodist::protocol_error);
  // A get's timeout past int64 saturates rather than turning negative.
  auto far = d::writer().str("k").u64(std::numeric_limits<std::uint64_t>::max()).take();
  auto g = d::decode_request(static_cast<std::uint16_t>(d::op::get), far);
  BOOST_TEST(std::get<d::get_request>(*g).timeout.count() > 0);
}

// Replies are read from just after their status: ok gives the fields, the
// others throw with the server's text.
BOOST_AUTO_TEST_CASE(native_replies_open_at_their_status, *utf::timeout(30)) {
  namespace d = cs::detail;
  d::reply ok(d::ok_reply().str("value").take());
  BOOST_TEST(ok.str() == "value");
  BOOST_CHECK_THROW(ok.u8(), corodist::protocol_error); // nothing more
  try {
    d::reply r(d::failed_reply(d::status::timeout, "timed out after 5 ms"));
    BOOST_FAIL("a timeout reply opened");
  } catch (const corodist::timeout_error& e) {
    BOOST_TEST(contains(e.what(), "after 5 ms"), e.what());
  }
  BOOST_CHECK_THROW(d::reply(d::failed_reply(d::status::error, "no")), corodist::store::store_error);
  BOOST_CHECK_THROW(d::reply(corodist::net::bytes{}), corodist::protocol_error);
  BOOST_CHECK_THROW(d::reply(corodist::net::bytes{std::byte{7}}), corodist::protocol_error);
  auto e = d::encode_watch_event(3, cs::watch_event{cs::watch_event::kind::updated, "k", "v"});
  auto f = d::decode_watch_event(e);
  BOOST_TEST(f.watch_id == 3u);
  BOOST_TEST(f.event.key == "k");
  BOOST_TEST(f.event.value == "v");
  e[8] = std::byte{9}; // no such event kind
  BOOST_CHECK_THROW(d::decode_watch_event(e), corodist::protocol_error);
}

// PyTorch queries decode only once whole (every shorter prefix is
// incomplete); an absurd length or an unknown code is refused at once; the
// version is told from the first bytes.
BOOST_AUTO_TEST_CASE(pytorch_queries_decode_once_whole, *utf::timeout(30)) {
  namespace t = cs::detail::torch;
  cs::detail::engine_limits limits;
  limits.max_key_size = 64;
  limits.max_value_size = 1024;
  limits.max_keys_per_request = 8;
  std::string bytes;
  t::encode_query(t::version::v2, t::multi_set_query{{"/a", "/b"}, {"1", std::string(100, 'x')}}, bytes);
  t::encode_query(t::version::v2, t::ping_query{7}, bytes);
  const auto first = bytes.size() - 5;
  auto in = [&](std::size_t n) { return std::span(reinterpret_cast<const std::uint8_t*>(bytes.data()), n); };
  for (std::size_t n = 0; n < first; ++n)
    BOOST_TEST(!t::decode_query(t::version::v2, in(n), limits));
  auto d = t::decode_query(t::version::v2, in(bytes.size()), limits);
  BOOST_REQUIRE(d);
  BOOST_TEST(d->size == first);
  auto& ms = std::get<t::multi_set_query>(d->q);
  BOOST_TEST((ms.keys == std::vector<std::string>{"/a", "/b"}));
  BOOST_TEST(ms.values[1].size() == 100u);
  std::string too_long(1, '\0'); // 1.13 SET whose key claims 1 TiB: refused before its bytes come
  const std::uint64_t tib = std::uint64_t{1} << 40;
  too_long.append(reinterpret_cast<const char*>(&tib), 8);
  BOOST_CHECK_THROW(t::decode_query(t::version::v1, std::span(reinterpret_cast<const std::uint8_t*>(too_long.data()),
                                                              too_long.size()),
                                    limits),
                    corodist::protocol_error);
  const std::uint8_t unknown[] = {0x1f};
  BOOST_CHECK_THROW(t::decode_query(t::version::v2, unknown, limits), corodist::protocol_error);
  const std::uint8_t watch_key[] = {7};
  BOOST_CHECK_THROW(t::decode_query(t::version::v1, watch_key, limits), corodist::protocol_error);
  BOOST_CHECK_THROW(t::encode_query(t::version::v1, t::multi_set_query{}, bytes), corodist::store::store_error);
  BOOST_TEST(!t::detect_version(in(0)));
  std::string v2;
  t::encode_query(t::version::v2, t::validate_query{}, v2);
  BOOST_TEST((t::detect_version(std::span(reinterpret_cast<const std::uint8_t*>(v2.data()), v2.size())) ==
              t::version::v2));
  const std::uint8_t v1_set[] = {0, 2, 0, 0, 0, 0, 0, 0, 0};
  BOOST_TEST((t::detect_version(v1_set) == t::version::v1));
  const std::uint8_t v1_get[] = {2};
  BOOST_TEST((t::detect_version(v1_get) == t::version::v1));
}

BOOST_AUTO_TEST_SUITE_END()

// A wait that lasts warns, first after the schedule's first delay and then
// every interval, naming its keys and where they are awaited; one whose
// deadline comes no later than the first warning never does. (The store's
// schedule is 5 s, then every 30 s; this test's 20 ms, then every 20 ms.)
BOOST_AUTO_TEST_CASE(long_waits_warn_naming_their_keys, *utf::timeout(30)) {
  corodist::test::log_capture log;
  corodist::test::warning_schedule_for_test schedule(20ms, 20ms);
  asio::io_context ctx;
  auto work = asio::make_work_guard(ctx);
  std::thread runner([&] { ctx.run(); });
  cs::detail::wait_log waits(ctx.get_executor(), "somewhere:1");
  const std::vector<std::string> keys{"slow/key", "other"};
  const std::vector<std::string> quick{"quick/key"};
  std::unique_ptr<cs::detail::wait_log::entry> long_wait, short_wait;
  auto on_ctx = [&](auto f) { // the log's entries live on its executor
    asio::co_spawn(ctx, [&]() -> asio::awaitable<void> { f(); co_return; }, asio::use_future).get();
  };
  on_ctx([&] {
    long_wait = std::make_unique<cs::detail::wait_log::entry>(waits, keys, 0ms);
    short_wait = std::make_unique<cs::detail::wait_log::entry>(waits, quick, 20ms);
  });
  auto warned = log.wait_for("still waiting for keys slow/key, other at somewhere:1", 2);
  on_ctx([&] {
    long_wait.reset();
    short_wait.reset();
  });
  work.reset();
  runner.join();
  BOOST_REQUIRE(warned.size() >= 2u);
  BOOST_TEST(contains(warned[0], "no deadline"), warned[0]);
  BOOST_TEST(log.lines("quick/key").empty()); // its deadline came before its first warning would
}
