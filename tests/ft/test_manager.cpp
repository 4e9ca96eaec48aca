// ft::manager in one process: replicas are coroutines on one io_context, each
// with its own tcp_store connection to a store_server; a replica is lost when
// its store connection closes (the server then deletes its owned key, as it
// does when a process dies or hangs past the heartbeat deadline). The
// multi-process cases (kill -9, SIGSTOP, partitions) are in test_ft_train.cpp.
#define BOOST_TEST_MODULE ft
#include <boost/test/unit_test.hpp>

#include "ft/round_keys.hpp"
#include "support/cancel.hpp"
#include "support/forwarding_store.hpp"
#include "support/coro_test.hpp"

#include <corodist/collective/device_mesh.hpp>
#include <corodist/collective/errors.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/future.hpp>
#include <corodist/core/when_all.hpp>
#include <corodist/ft/manager.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/experimental/parallel_group.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace cf = corodist::ft;
namespace cs = corodist::store;
namespace cc = corodist::collective;
using namespace std::chrono_literals;

namespace {

/// A store server and its clients on one io_context.
struct bed {
  asio::io_context ctx;
  std::shared_ptr<cs::store_server> server;

  bed() {
    cs::server_options so;
    so.host = "127.0.0.1";
    so.port = 0;
    server = cs::store_server::start(ctx.get_executor(), so);
  }
  ~bed() {
    server->stop();
    corodist::test::settle(ctx); // the aborted accept runs before the context goes
  }

  asio::awaitable<std::shared_ptr<cs::tcp_store>> client() {
    cs::tcp_store_options o;
    o.host = "127.0.0.1";
    o.port = server->local_endpoint().port();
    co_return co_await cs::tcp_store::connect(ctx.get_executor(), o);
  }

  /// Runs `make()` as a coroutine of its own; the future completes with it.
  /// (`make` lives as long as its coroutine: a lambda coroutine reads its
  /// captures through the closure.)
  corodist::future<void> spawn(std::function<asio::awaitable<void>()> make) {
    corodist::promise<void> p;
    auto f = p.get_future();
    auto run = [](std::shared_ptr<std::function<asio::awaitable<void>()>> m) -> asio::awaitable<void> {
      co_await (*m)();
    };
    asio::co_spawn(ctx, run(std::make_shared<std::function<asio::awaitable<void>()>>(std::move(make))),
                   [p = std::move(p)](std::exception_ptr e) mutable {
      if (e)
        p.set_exception(e);
      else
        p.set_value();
    });
    return f;
  }
};

/// `first`: the first quorum's size (all replicas); later ones go on with `min_replicas`.
cf::manager_options options(std::string id, int first = 1, int min_replicas = 1) {
  cf::manager_options o;
  o.replica_id = std::move(id);
  o.initial_replicas = first;
  o.min_replicas = min_replicas;
  o.poll_interval = 5ms;
  o.quorum_timeout = 20s;
  o.group.timeout = 10s;
  return o;
}

/// One replica: a manager, a state of 4 floats registered for recovery, and
/// what it saw.
struct replica {
  std::shared_ptr<cs::tcp_store> store;
  std::unique_ptr<cf::manager> mgr;
  std::vector<float> state = std::vector<float>(4);
  std::vector<cf::quorum> quorums;
  std::vector<bool> commits;
  std::vector<float> sums; // the allreduce of each step

  asio::awaitable<void> open(bed& b, cf::manager_options o, float init) {
    store = co_await b.client();
    co_await open_on(store, std::move(o), init);
  }
  /// As open(), the manager on `s` (the replica's own store, or one that wraps it).
  asio::awaitable<void> open_on(std::shared_ptr<cs::store> s, cf::manager_options o, float init) {
    mgr = co_await cf::manager::create(std::move(s), o);
    for (auto& x : state) x = init;
    mgr->register_state("state", state);
  }

  /// One step: quorum, an allreduce of rank+1, the commit; on commit the state grows by the sum.
  asio::awaitable<bool> step(bool ok = true, bool reduce = true) {
    quorums.push_back(co_await mgr->start_step());
    float v = static_cast<float>(quorums.back().rank + 1);
    if (reduce) {
      std::vector<float> g{v};
      try {
        co_await mgr->group()->allreduce(g);
        v = g[0];
      } catch (const cc::collective_failure&) {
        ok = false;
      }
    }
    sums.push_back(v);
    bool c = co_await mgr->should_commit(ok);
    commits.push_back(c);
    if (c)
      for (auto& x : state) x += v;
    co_return c;
  }
};

/// What a process-group factory was asked (manager_options::make_group).
struct asked {
  int rank = -1;
  int size = 0;
  std::string prefix;
  bool had_previous = false;
  bool subset = false;
  std::vector<int> lost;
  std::string options_prefix;
};

asio::awaitable<std::shared_ptr<cc::process_group>> form_gloo(cf::group_spec r) {
  co_return co_await cc::gloo_group::create(r.store, r.rank, r.size, r.options);
}

/// A factory that records each request and forms the default Gloo group.
cf::group_factory recording_factory(std::vector<asked>& log) {
  return [&log](const cf::group_spec& r) {
    log.push_back({r.rank, r.size, r.prefix, r.previous != nullptr, r.subset_of_previous, r.lost, r.options.prefix});
    return form_gloo(r);
  };
}

std::vector<std::string> ids(const cf::quorum& q) {
  std::vector<std::string> out;
  for (const auto& m : q.members) out.push_back(m.replica_id);
  return out;
}

/// A replica's store that, once armed, is lost just after its vote was
/// counted: its add to a round's vote count waits until the other members' votes are in (so
/// that it is the last voter), reaches the server, and then the connection
/// closes before the reply is used (the replica never learns the count, nor
/// writes the outcome). Everything else goes to the tcp_store.
class lost_after_its_vote : public corodist::test::forwarding_store {
public:
  lost_after_its_vote(std::shared_ptr<cs::tcp_store> s, std::vector<std::string> others)
      : forwarding_store(s), s_(std::move(s)), others_(std::move(others)) {}

  bool armed = false;

private:
  asio::awaitable<std::int64_t> do_add(std::string key, std::int64_t delta) override {
    const std::string count = "votes";
    if (!armed || key.size() < count.size() || key.compare(key.size() - count.size(), count.size(), count) != 0)
      co_return co_await s_->add(std::move(key), delta);
    const auto round = key.substr(0, key.size() - count.size()); // ".../r/<r>/"
    std::vector<std::string> votes;
    for (const auto& o : others_)
      votes.push_back(round + "vote/" + o);
    asio::steady_timer t(co_await asio::this_coro::executor);
    while (!co_await s_->check(votes)) {
      t.expires_after(5ms);
      co_await t.async_wait(asio::use_awaitable);
    }
    co_await s_->add(std::move(key), delta);
    s_->close();
    throw corodist::connection_error("the test: lost after its vote was counted");
  }

  std::shared_ptr<cs::tcp_store> s_;
  std::vector<std::string> others_;
};

/// Completes once `key` is in the store (seen through `s`).
asio::awaitable<void> key_appears(std::shared_ptr<cs::tcp_store> s, std::string key) {
  std::vector<std::string> keys{std::move(key)};
  co_await s->wait(std::move(keys), 30s);
}

/// Races `op` against `event` in a parallel group that waits for the first
/// to finish and cancels the other: `op` is cancelled mid-flight when the
/// event comes first. Returns how `op` ended and whether the event won.
template <typename T>
asio::awaitable<std::pair<std::exception_ptr, bool>> cancel_on(asio::awaitable<T> op, asio::awaitable<void> event) {
  auto ex = co_await asio::this_coro::executor;
  auto result = co_await asio::experimental::make_parallel_group(
                    asio::co_spawn(ex, std::move(op), asio::experimental::deferred),
                    asio::co_spawn(ex, std::move(event), asio::experimental::deferred))
                    .async_wait(asio::experimental::wait_for_one(), asio::use_awaitable);
  auto event_error = std::get<std::tuple_size_v<decltype(result)> - 1>(result);
  if (event_error) std::rethrow_exception(event_error);
  co_return std::pair(std::get<1>(result), std::get<0>(result)[0] == 1);
}

} // namespace

BOOST_AUTO_TEST_SUITE(manager)

BOOST_AUTO_TEST_CASE(three_replicas_agree_on_every_step) {
  bed b;
  std::map<std::string, replica> rs;
  corodist::test::run_coro(b.ctx, [&]() -> asio::awaitable<void> {
    std::vector<corodist::future<void>> fs;
    float init = 1;
    for (std::string id : {"a", "b", "c"}) {
      auto& r = rs[id];
      fs.push_back(b.spawn([&, id, init]() -> asio::awaitable<void> {
        co_await r.open(b, options(id, 3), init);
        for (int i = 0; i < 5; ++i) co_await r.step();
      }));
      init += 1;
    }
    co_await corodist::when_all(std::move(fs)).async_get();
  }(), 60s);
  for (auto& [id, r] : rs) {
    BOOST_TEST_CONTEXT("replica " << id) {
      BOOST_TEST(r.mgr->step() == 5u);
      BOOST_REQUIRE(r.quorums.size() == 5u);
      for (std::size_t i = 0; i < 5; ++i) {
        BOOST_TEST(r.quorums[i].id == i + 1);
        BOOST_TEST(r.quorums[i].size() == 3);
        BOOST_TEST(r.quorums[i].reconfigured == (i == 0));
        BOOST_TEST(r.sums[i] == 6.0f);
        BOOST_TEST(r.commits[i]);
      }
      // The first quorum sends replica a's state to the others.
      BOOST_TEST(r.quorums[0].recovered);
      BOOST_TEST(r.quorums[0].source == 0);
      BOOST_TEST(r.quorums[0].joined.size() == 3u);
      BOOST_TEST(r.state == std::vector<float>(4, 1.0f + 5 * 6.0f));
      BOOST_TEST(ids(r.quorums[0]) == (std::vector<std::string>{"a", "b", "c"}));
    }
  }
  BOOST_TEST(rs["a"].quorums[0].rank == 0);
  BOOST_TEST(rs["c"].quorums[0].rank == 2);
}

BOOST_AUTO_TEST_CASE(a_lost_replica_is_left_out) {
  bed b;
  std::map<std::string, replica> rs;
  corodist::test::run_coro(b.ctx, [&]() -> asio::awaitable<void> {
    std::vector<corodist::future<void>> fs;
    for (std::string id : {"a", "b", "c"}) {
      auto& r = rs[id];
      fs.push_back(b.spawn([&, id]() -> asio::awaitable<void> {
        co_await r.open(b, options(id, 3, 2), 0);
        if (id == "c") {
          for (int i = 0; i < 2; ++i) co_await r.step();
          r.store->close(); // lost: its owned key goes with the connection
          co_return;
        }
        for (int i = 0; i < 5; ++i) co_await r.step();
      }));
    }
    co_await corodist::when_all(std::move(fs)).async_get();
  }(), 60s);
  for (std::string id : {"a", "b"}) {
    auto& r = rs[id];
    BOOST_TEST_CONTEXT("replica " << id) {
      BOOST_TEST(r.mgr->step() == 5u);
      BOOST_TEST(r.quorums[2].size() == 2);
      BOOST_TEST(r.quorums[2].reconfigured);
      BOOST_TEST(!r.quorums[2].recovered);
      BOOST_TEST(r.quorums[2].left == std::vector<std::string>{"c"});
      BOOST_TEST(r.sums[4] == 3.0f);
      BOOST_TEST(r.state == std::vector<float>(4, 2 * 6.0f + 3 * 3.0f));
    }
  }
}

// A custom make_group is asked for each new group: first without a previous
// group, then, once b (rank 1 of a, b, c) is lost, with the previous group
// and its lost rank 1.
BOOST_AUTO_TEST_CASE(make_group_is_told_which_ranks_were_lost) {
  bed b;
  std::map<std::string, replica> rs;
  std::map<std::string, std::vector<asked>> logs;
  corodist::test::run_coro(b.ctx, [&]() -> asio::awaitable<void> {
    std::vector<corodist::future<void>> fs;
    for (std::string id : {"a", "b", "c"}) {
      auto& r = rs[id];
      fs.push_back(b.spawn([&, id]() -> asio::awaitable<void> {
        auto o = options(id, 3, 2);
        o.make_group = recording_factory(logs[id]);
        co_await r.open(b, o, 0);
        if (id == "b") {
          for (int i = 0; i < 2; ++i) co_await r.step();
          r.store->close();
          co_return;
        }
        for (int i = 0; i < 4; ++i) co_await r.step();
      }));
    }
    co_await corodist::when_all(std::move(fs)).async_get();
  }(), 60s);
  for (std::string id : {"a", "c"}) {
    const auto& log = logs[id];
    const int before = id == "a" ? 0 : 2;
    const int after = id == "a" ? 0 : 1;
    BOOST_TEST_CONTEXT("replica " << id) {
      BOOST_REQUIRE(log.size() == 2u);
      BOOST_TEST(log[0].rank == before);
      BOOST_TEST(log[0].size == 3);
      BOOST_TEST(!log[0].had_previous);
      BOOST_TEST(!log[0].subset);
      BOOST_TEST(log[0].lost.empty());
      BOOST_TEST(log[1].rank == after);
      BOOST_TEST(log[1].size == 2);
      BOOST_TEST(log[1].had_previous);
      BOOST_TEST(log[1].subset);
      BOOST_TEST(log[1].lost == std::vector<int>{1});
      BOOST_TEST(log[0].prefix != log[1].prefix);
      BOOST_TEST(log[1].options_prefix == log[1].prefix);
      BOOST_TEST(rs[id].sums[3] == 3.0f);
      BOOST_TEST(rs[id].mgr->step() == 4u);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_new_replica_receives_the_state) {
  bed b;
  std::map<std::string, replica> rs;
  corodist::promise<void> three_done;
  auto three = three_done.get_future();
  corodist::test::run_coro(b.ctx, [&]() -> asio::awaitable<void> {
    std::vector<corodist::future<void>> fs;
    for (std::string id : {"a", "b"}) {
      auto& r = rs[id];
      fs.push_back(b.spawn([&, id]() -> asio::awaitable<void> {
        co_await r.open(b, options(id, 2), 0);
        for (int i = 0; i < 3; ++i) co_await r.step();
        if (id == "a") three_done.set_value();
        // Train on until the joiner is in, then two more steps.
        while (r.quorums.back().size() < 3) co_await r.step();
        for (int i = 0; i < 2; ++i) co_await r.step();
      }));
    }
    auto& c = rs["c"];
    fs.push_back(b.spawn([&]() -> asio::awaitable<void> {
      co_await three.async_get();
      co_await c.open(b, options("c", 2), -100);
      for (int i = 0; i < 3; ++i) co_await c.step();
    }));
    co_await corodist::when_all(std::move(fs)).async_get();
  }(), 60s);
  auto& a = rs["a"];
  auto& c = rs["c"];
  const auto& first = c.quorums[0];
  BOOST_TEST(first.joined == std::vector<std::string>{"c"});
  BOOST_TEST(first.recovered);
  BOOST_TEST(first.reconfigured);
  BOOST_TEST(first.members[first.source].replica_id != "c");
  BOOST_TEST(first.members[2].step == 0u);
  BOOST_TEST(first.max_step >= 3u);
  BOOST_TEST(c.mgr->step() == a.mgr->step());
  BOOST_TEST(c.state == a.state);
  BOOST_TEST(c.state == rs["b"].state);
  BOOST_TEST(c.sums.back() == 6.0f);
}

BOOST_AUTO_TEST_CASE(a_replica_lost_before_it_reports_fails_the_step_everywhere) {
  bed b;
  std::map<std::string, replica> rs;
  corodist::test::run_coro(b.ctx, [&]() -> asio::awaitable<void> {
    std::vector<corodist::future<void>> fs;
    for (std::string id : {"a", "b", "c"}) {
      auto& r = rs[id];
      fs.push_back(b.spawn([&, id]() -> asio::awaitable<void> {
        co_await r.open(b, options(id, 3, 2), 0);
        co_await r.step();
        if (id == "c") {
          r.quorums.push_back(co_await r.mgr->start_step());
          r.store->close(); // lost inside the step, before its vote
          co_return;
        }
        co_await r.step(true, false); // the step c never finishes
        co_await r.step();
      }));
    }
    co_await corodist::when_all(std::move(fs)).async_get();
  }(), 60s);
  for (std::string id : {"a", "b"}) {
    auto& r = rs[id];
    BOOST_TEST_CONTEXT("replica " << id) {
      BOOST_TEST(r.commits == (std::vector<bool>{true, false, true}));
      BOOST_TEST(r.mgr->step() == 2u);
      BOOST_TEST(r.quorums[2].size() == 2);
      BOOST_TEST(r.quorums[2].reconfigured);
      BOOST_TEST(r.state == std::vector<float>(4, 6.0f + 3.0f));
    }
  }
}

// c votes last in the second step, its vote is counted, and it is lost
// before it learns the count (so it never writes the outcome). a and b,
// waiting for the outcome, find c gone with its vote in: they write the
// outcome of the count themselves (every vote ok: committed) instead of
// waiting for the quorum timeout, and go on at two.
BOOST_AUTO_TEST_CASE(the_last_voter_lost_before_the_outcome_does_not_stall_the_others) {
  bed b;
  std::map<std::string, replica> rs;
  bool c_lost = false;
  corodist::test::run_coro(b.ctx, [&]() -> asio::awaitable<void> {
    std::vector<corodist::future<void>> fs;
    for (std::string id : {"a", "b", "c"}) {
      auto& r = rs[id];
      fs.push_back(b.spawn([&, id]() -> asio::awaitable<void> {
        if (id != "c") {
          co_await r.open(b, options(id, 3, 2), 0);
          for (int i = 0; i < 3; ++i) co_await r.step();
          co_return;
        }
        r.store = co_await b.client();
        auto faulty = std::make_shared<lost_after_its_vote>(r.store, std::vector<std::string>{"a", "b"});
        co_await r.open_on(faulty, options(id, 3, 2), 0);
        co_await r.step();
        faulty->armed = true;
        try {
          co_await r.step(); // its add of the second step's vote loses the connection
        } catch (const corodist::connection_error&) {
          c_lost = true;
        }
      }));
    }
    co_await corodist::when_all(std::move(fs)).async_get();
  }(), 60s);
  BOOST_TEST(c_lost);
  for (std::string id : {"a", "b"}) {
    auto& r = rs[id];
    BOOST_TEST_CONTEXT("replica " << id) {
      BOOST_TEST(r.commits == (std::vector<bool>{true, true, true}));
      BOOST_TEST(r.mgr->step() == 3u);
      BOOST_TEST(r.quorums[2].size() == 2);
      BOOST_TEST(r.quorums[2].left == std::vector<std::string>{"c"});
      BOOST_TEST(r.state == std::vector<float>(4, 2 * 6.0f + 3.0f));
    }
  }
}

BOOST_AUTO_TEST_CASE(one_failed_member_fails_the_step_for_all) {
  bed b;
  std::map<std::string, replica> rs;
  corodist::test::run_coro(b.ctx, [&]() -> asio::awaitable<void> {
    std::vector<corodist::future<void>> fs;
    for (std::string id : {"a", "b", "c"}) {
      auto& r = rs[id];
      fs.push_back(b.spawn([&, id]() -> asio::awaitable<void> {
        co_await r.open(b, options(id, 3), 0);
        co_await r.step();
        co_await r.step(id != "b");
        co_await r.step();
      }));
    }
    co_await corodist::when_all(std::move(fs)).async_get();
  }(), 60s);
  for (auto& [id, r] : rs) {
    BOOST_TEST_CONTEXT("replica " << id) {
      BOOST_TEST(r.commits == (std::vector<bool>{true, false, true}));
      BOOST_TEST(r.mgr->step() == 2u);
      BOOST_TEST(r.quorums[2].reconfigured); // a failed step asks for a new group
      BOOST_TEST(r.quorums[2].size() == 3);
    }
  }
}

BOOST_AUTO_TEST_CASE(too_few_replicas_time_out) {
  bed b;
  replica r;
  auto o = options("a", 2);
  o.quorum_timeout = 300ms;
  BOOST_CHECK_THROW(corodist::test::run_coro(b.ctx, [&]() -> asio::awaitable<void> {
    co_await r.open(b, o, 0);
    co_await r.mgr->start_step();
  }(), 20s), corodist::timeout_error);
}

BOOST_AUTO_TEST_CASE(bad_options_are_refused) {
  bed b;
  replica r;
  for (const std::string& id : std::vector<std::string>{"", "a b", "a/b", std::string(129, 'x')})
    BOOST_CHECK_THROW(corodist::test::run_coro(b.ctx, r.open(b, options(id), 0)), corodist::usage_error);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(manager_cancellation)

// a's start_step, waiting alone for the first quorum, is cancelled once its
// line is in the round: operation_aborted and no step started. Its line stays
// (b's quorum counts a), and a's next start_step takes its place in that
// quorum: both then train together, with no timeout on the way.
BOOST_AUTO_TEST_CASE(a_cancelled_start_step_starts_no_step_and_the_next_one_serves_the_quorum) {
  bed b;
  std::map<std::string, replica> rs;
  std::exception_ptr cancelled;
  bool mid_flight = false, no_step = false, commit_refused = false;
  corodist::test::run_coro(b.ctx, [&]() -> asio::awaitable<void> {
    auto& a = rs["a"];
    auto& other = rs["b"];
    const cf::detail::round_keys keys(cf::manager_options::default_prefix);
    auto watcher = co_await b.client();
    co_await a.open(b, options("a", 2), 1);
    std::tie(cancelled, mid_flight) = co_await cancel_on(a.mgr->start_step(), key_appears(watcher, keys.joiners(1)));
    no_step = a.mgr->step() == 0 && !a.mgr->group() && a.mgr->current().members.empty();
    try {
      co_await a.mgr->should_commit(true);
    } catch (const corodist::usage_error&) {
      commit_refused = true;
    }
    std::vector<corodist::future<void>> fs;
    fs.push_back(b.spawn([&]() -> asio::awaitable<void> {
      co_await other.open(b, options("b", 2), 2);
      for (int i = 0; i < 2; ++i) co_await other.step();
    }));
    co_await key_appears(watcher, keys.decision(1)); // b's quorum, a counted in it
    fs.push_back(b.spawn([&]() -> asio::awaitable<void> {
      for (int i = 0; i < 2; ++i) co_await a.step();
    }));
    co_await corodist::when_all(std::move(fs)).async_get();
  }(), 60s);
  BOOST_TEST(mid_flight);
  corodist::test::check_operation_aborted(cancelled);
  BOOST_TEST(no_step);
  BOOST_TEST(commit_refused);
  for (auto& [id, r] : rs) {
    BOOST_TEST_CONTEXT("replica " << id) {
      BOOST_REQUIRE(r.quorums.size() == 2u);
      BOOST_TEST(r.quorums[0].id == 1u); // the quorum a's cancelled call was counted in
      BOOST_TEST(ids(r.quorums[0]) == (std::vector<std::string>{"a", "b"}));
      BOOST_TEST(r.commits == (std::vector<bool>{true, true}));
      BOOST_TEST(r.sums == (std::vector<float>{3.0f, 3.0f}));
      BOOST_TEST(r.mgr->step() == 2u);
      BOOST_TEST(r.state == std::vector<float>(4, 1.0f + 2 * 3.0f)); // a's state sent to b, then two steps
    }
  }
}

// a's should_commit cancelled once its vote is counted (b has not voted):
// operation_aborted, the step over without a decision here (step() unchanged,
// a second should_commit refused); its vote counts for b, which commits. a's
// next step receives the state it missed and both go on alike.
BOOST_AUTO_TEST_CASE(a_cancelled_should_commit_leaves_its_vote_and_the_replica_catches_up) {
  bed b;
  std::map<std::string, replica> rs;
  std::exception_ptr cancelled;
  bool mid_flight = false, commit_refused = false;
  std::uint64_t step_after = 99;
  corodist::test::run_coro(b.ctx, [&]() -> asio::awaitable<void> {
    corodist::promise<void> a_cancelled_p;
    auto a_cancelled = a_cancelled_p.get_future().share();
    const cf::detail::round_keys keys(cf::manager_options::default_prefix);
    std::vector<corodist::future<void>> fs;
    for (std::string id : {"a", "b"}) {
      auto& r = rs[id];
      fs.push_back(b.spawn([&, id]() -> asio::awaitable<void> {
        co_await r.open(b, options(id, 2), id == "a" ? 1.0f : 2.0f);
        co_await r.step();
        r.quorums.push_back(co_await r.mgr->start_step()); // a step without a collective
        if (id == "a") {
          auto watcher = co_await b.client();
          std::tie(cancelled, mid_flight) =
              co_await cancel_on(r.mgr->should_commit(true), key_appears(watcher, keys.votes(r.quorums.back().id)));
          step_after = r.mgr->step();
          try {
            co_await r.mgr->should_commit(true);
          } catch (const corodist::usage_error&) {
            commit_refused = true;
          }
          a_cancelled_p.set_value();
        } else {
          co_await a_cancelled.async_get(); // b votes after a's vote was counted and its call cancelled
          r.commits.push_back(co_await r.mgr->should_commit(true));
        }
        co_await r.step();
      }));
    }
    co_await corodist::when_all(std::move(fs)).async_get();
  }(), 60s);
  BOOST_TEST(mid_flight);
  corodist::test::check_operation_aborted(cancelled);
  BOOST_TEST(step_after == 1u);
  BOOST_TEST(commit_refused);
  auto& a = rs["a"];
  auto& other = rs["b"];
  BOOST_TEST(other.commits == (std::vector<bool>{true, true, true})); // a's vote counted
  BOOST_TEST(a.commits == (std::vector<bool>{true, true}));
  BOOST_REQUIRE(a.quorums.size() == 3u);
  BOOST_TEST(a.quorums[2].recovered); // a was a step behind: it received b's state
  BOOST_TEST(!a.quorums[2].reconfigured);
  BOOST_TEST(a.mgr->step() == 3u);
  BOOST_TEST(other.mgr->step() == 3u);
  BOOST_TEST(a.state == other.state);
  BOOST_TEST(a.state == std::vector<float>(4, 1.0f + 2 * 3.0f));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(manager_with_mesh)

// A dp x tp mesh whose dp dimension ft::manager re-forms: three replicas
// (a, b, c) of two processes each (tp coordinates 0 and 1, each with its own
// store connection). Each replica's tp group is made once; the processes of
// tp coordinate t of every replica run a manager under their own prefix,
// whose group is the mesh's dp dimension. After two steps replica c is lost
// as a whole (both its processes); a and b go on with a dp dimension of two
// and the same tp group, and every replica's tp ranks stay at the same step.
BOOST_AUTO_TEST_CASE(a_mesh_whose_dp_dimension_the_manager_reforms) {
  bed b;
  struct process {
    replica rep;
    cc::device_mesh mesh;
    std::shared_ptr<cc::process_group> tp; // the replica's tp group, made once
    std::vector<int> dp_sizes;
    std::vector<float> tp_sums, dp_sums;
  };
  std::map<std::string, process> ps; // "a0", "a1", ...
  corodist::test::run_coro(b.ctx, [&]() -> asio::awaitable<void> {
    std::vector<corodist::future<void>> fs;
    for (std::string id : {"a", "b", "c"})
      for (int t = 0; t < 2; ++t) {
        auto& p = ps[id + std::to_string(t)];
        fs.push_back(b.spawn([&, id, t]() -> asio::awaitable<void> {
          p.rep.store = co_await b.client();
          cc::gloo_options go;
          go.host = "127.0.0.1";
          go.prefix = "mesh/" + id + "/replica";
          go.timeout = 10s;
          std::shared_ptr<cc::process_group> replica_group = co_await cc::gloo_group::create(p.rep.store, t, 2, go);
          std::vector<cc::mesh_dim> inner{{"tp", 2}};
          const auto local = co_await cc::device_mesh::create(replica_group, inner);
          p.tp = local.group("tp");
          auto o = options(id, 3, 2);
          o.prefix = "mesh/ft/tp" + std::to_string(t);
          co_await p.rep.open_on(p.rep.store, o, 0);
          const int steps = id == "c" ? 2 : 5;
          std::exception_ptr failed;
          try {
            for (int i = 0; i < steps; ++i) {
              auto q = co_await p.rep.mgr->start_step();
              if (q.reconfigured)
                p.mesh = local.with_outer_dimension("dp", p.rep.mgr->group());
              if (p.mesh.group("tp") != p.tp)
                throw std::runtime_error("the tp group changed");
              std::vector<float> g{static_cast<float>(t + 1)};
              co_await p.mesh.group("tp")->allreduce(g);
              p.tp_sums.push_back(g[0]);
              g[0] = static_cast<float>(p.mesh.coordinate("dp") + 1);
              co_await p.mesh.group("dp")->allreduce(g);
              p.dp_sums.push_back(g[0]);
              p.dp_sizes.push_back(p.mesh.size("dp"));
              (void)co_await p.rep.mgr->should_commit(true);
              // The tp ranks of a replica must stay at one step (else its shards diverge).
              std::vector<std::int64_t> lo{static_cast<std::int64_t>(p.rep.mgr->step())}, hi = lo;
              co_await p.tp->allreduce(lo, cc::reduce_op::min);
              co_await p.tp->allreduce(hi, cc::reduce_op::max);
              if (lo != hi)
                throw std::runtime_error("the tp ranks of replica " + id + " are at different steps");
            }
          } catch (...) {
            failed = std::current_exception();
          }
          // Replica c is lost as a whole: both processes' owned keys go, even
          // when one's last collective failed because the other left first.
          if (id == "c")
            p.rep.store->close();
          else if (failed)
            std::rethrow_exception(failed);
        }));
      }
    co_await corodist::when_all(std::move(fs)).async_get();
  }(), 90s);
  for (std::string name : {"a0", "a1", "b0", "b1"}) {
    auto& p = ps[name];
    BOOST_TEST_CONTEXT("process " << name) {
      BOOST_TEST(p.rep.mgr->step() == 5u);
      BOOST_TEST(p.dp_sizes == (std::vector<int>{3, 3, 2, 2, 2}));
      BOOST_TEST(p.tp_sums == std::vector<float>(5, 3.0f));
      BOOST_TEST(p.dp_sums == (std::vector<float>{6, 6, 3, 3, 3}));
      BOOST_TEST(p.mesh.ndim() == 2);
      BOOST_TEST(p.mesh.coordinate("tp") == (name[1] - '0'));
      BOOST_TEST(p.mesh.group("tp") == p.tp);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
