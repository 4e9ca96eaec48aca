// The debug responder, gather_dumps and the hang verdict over a real
// store_server and tcp_store clients, with real flight recorders. (Ranks in
// one process share its recorders: every answer lists the same ones; the
// per-rank scenarios are the tools suite's, under corodist-run.)
// BOOST_TEST_MODULE is defined in another translation unit.
#include <boost/test/unit_test.hpp>

#include <corodist/core/flight_recorder.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/debug_responder.hpp>
#include <corodist/store/hang_verdict.hpp>
#include <corodist/store/sync_store.hpp>

#include "store/store_fixtures.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cs = corodist::store;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

} // namespace

BOOST_AUTO_TEST_SUITE(debug_responder)

// Each responding rank answers an ask with its recorders; a rank without a
// responder is named as not answering; the answers' keys are removed.
BOOST_AUTO_TEST_CASE(gather_names_who_answered, *utf::timeout(60)) {
  corodist::test::tcp_impl impl;
  auto rec = corodist::flight_recorder::create("collective", "g-gather");
  const auto h = rec->record({.seq = 3, .op = "allreduce", .detail = "float32 x 1000, sum", .peer = "ranks 0-2"});
  std::vector<std::shared_ptr<cs::store>> stores;
  std::vector<std::shared_ptr<cs::debug_responder>> responders;
  for (int r = 0; r < 2; ++r) { // rank 2 starts none
    stores.push_back(impl.make());
    responders.push_back(cs::debug_responder::start(stores.back(), r, 3));
  }
  cs::sync_store s(impl.make());
  s.wait({cs::debug_key("rank/0"), cs::debug_key("rank/1")}, 10s); // both listen
  BOOST_TEST(s.get(cs::debug_key("world_size")) == "3");
  auto dumps = corodist::run_blocking(impl.loop.get_executor(), cs::gather_dumps(s.async(), 0, 1500ms));
  BOOST_REQUIRE_EQUAL(dumps.size(), 3u);
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST(dumps[r].problem.empty());
    auto doc = nlohmann::json::parse(dumps[r].json);
    BOOST_TEST(doc["label"].get<std::string>().starts_with("rank "));
    BOOST_TEST(dumps[r].offset_error.count() >= 0);
    bool found = false;
    for (auto& x : doc["recorders"])
      found = found || x["name"] == "g-gather";
    BOOST_TEST(found);
  }
  BOOST_TEST(dumps[2].json.empty());
  BOOST_TEST(contains(dumps[2].problem, "no debug responder registered"), dumps[2].problem);
  BOOST_TEST(s.list_keys(cs::debug_key("dump/")).empty());

  // The verdict: every answering rank waits in #3 (one process, one recorder).
  const auto v = cs::analyze_dumps(dumps);
  BOOST_TEST(v.waiting);
  BOOST_REQUIRE(!v.lines.empty());
  BOOST_TEST(contains(v.lines[0], "ranks 0,1 wait in allreduce #3 (float32 x 1000, sum) on group 'g-gather'"),
             v.text());
  BOOST_TEST(contains(v.text(), "no answer from rank 2"), v.text());
  BOOST_TEST(contains(v.text(), "rank 2 did not answer"), v.text());
  const auto all = nlohmann::json::parse(v.dumps_json());
  BOOST_TEST(all["ranks"].size() == 3u);
  BOOST_TEST(all["verdict"].size() == v.lines.size());
  rec->complete(h);
}

// An operation waiting past hang_after is reported once under debug/stuck.
BOOST_AUTO_TEST_CASE(stuck_operation_is_reported_once, *utf::timeout(60)) {
  corodist::test::tcp_impl impl;
  auto rec = corodist::flight_recorder::create("rpc", "w-stuck");
  const auto h = rec->record({.seq = 9, .op = "call", .detail = "load", .peer = "w1"});
  cs::debug_responder_options o;
  o.hang_after = 200ms;
  o.scan_every = 50ms;
  auto st = impl.make();
  auto resp = cs::debug_responder::start(st, 0, 1, o);
  BOOST_TEST(cs::debug_responder::current() == resp);
  cs::sync_store s(impl.make());
  s.wait({cs::debug_key("stuck/1")}, 20s);
  const auto text = s.get(cs::debug_key("stuck/1"));
  BOOST_TEST(contains(text, "rank 0: call #9 (load) on 'w-stuck' waiting since"), text);
  // The same operation is not reported again; a new one is.
  const auto h2 = rec->record({.seq = 10, .op = "call", .detail = "save", .peer = "w2"});
  s.wait({cs::debug_key("stuck/2")}, 20s);
  BOOST_TEST(contains(s.get(cs::debug_key("stuck/2")), "call #10 (save)"));
  rec->complete(h);
  rec->complete(h2);
  resp->stop();
  BOOST_TEST(!cs::debug_responder::current());
}

// The responder does not keep the store alive, and ends with it.
BOOST_AUTO_TEST_CASE(responder_ends_with_its_store, *utf::timeout(60)) {
  corodist::test::tcp_impl impl;
  auto st = impl.make();
  std::weak_ptr<cs::store> weak = st;
  auto resp = cs::debug_responder::start(st, 0, 1);
  auto other = impl.make();
  cs::sync_store(other).wait({cs::debug_key("rank/0"), cs::debug_key("world_size")}, 10s);
  BOOST_TEST(impl.server->connection_count() == 2u);
  st.reset();
  // The store goes once a request the responder has in flight returns: its
  // connection closes, and its owned key with it.
  BOOST_TEST(corodist::test::server_reaches(impl.server_loop, *impl.server,
                                            [&] { return impl.server->connection_count() == 1; }));
  BOOST_TEST(weak.expired());
  BOOST_TEST(!resp->job_store());
}

BOOST_AUTO_TEST_SUITE_END()
