// The timeline (trace-event JSON) made of flight-recorder dumps, and the
// tcp_store client's own entries. Linked into test_store.
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/flight_recorder.hpp>
#include <corodist/store/sync_store.hpp>
#include <corodist/store/timeline.hpp>

#include "store/store_fixtures.hpp"
#include "support/recorder_entries.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace utf = boost::unit_test;
using nlohmann::json;
using namespace std::chrono_literals;
namespace cs = corodist::store;

namespace {

/// A rank's dump made of real recorders: `fill` records into recorders it
/// creates, which are dumped while alive (and only they, of this layer).
template <typename Fill>
cs::rank_dump dump_of(int rank, Fill fill) {
  cs::rank_dump d;
  d.rank = rank;
  auto keep = fill();
  d.json = corodist::dump_flight_recorders();
  return d;
}

/// The events of `doc` with phase `ph`.
std::vector<json> phase(const json& doc, const std::string& ph) {
  std::vector<json> out;
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") == ph)
      out.push_back(e);
  return out;
}

/// The first event named `name` (null if none).
json named(const json& doc, const std::string& name) {
  for (const auto& e : doc.at("traceEvents"))
    if (e.value("name", "") == name && e.at("ph") != "M")
      return e;
  return nullptr;
}

/// Two ranks' dumps: rank 0 calls "load" on "w1" (flow 77) and marks a
/// gradient; rank 1 serves it, then starts a wait it never ends.
std::vector<cs::rank_dump> two_ranks() {
  std::vector<cs::rank_dump> dumps;
  dumps.push_back(dump_of(0, [] {
    auto rpc = corodist::flight_recorder::create("rpc", "w0");
    auto marks = corodist::flight_recorder::create("ddp", "reducer 9/marks");
    const auto h = rpc->record({.op = "call", .detail = "load", .peer = "w1", .bytes = 12});
    rpc->set_link(h, 5, 77);
    marks->complete(marks->record({.seq = 1, .op = "mark", .detail = "3"}));
    rpc->complete(h);
    return std::vector{rpc, marks};
  }));
  dumps.push_back(dump_of(1, [] {
    auto rpc = corodist::flight_recorder::create("rpc", "w1");
    auto st = corodist::flight_recorder::create("store", "127.0.0.1:1");
    rpc->complete(rpc->record({.seq = 5, .op = "serve", .detail = "load", .peer = "w0", .flow = 77}));
    st->fail(st->record({.op = "get", .detail = "k"}), "no key", "timeout");
    st->record({.op = "wait", .detail = "barrier/2"});
    return std::vector{rpc, st};
  }));
  return dumps;
}

} // namespace

BOOST_AUTO_TEST_SUITE(timeline)

// Each rank is a process, each recorder a named track, each entry a complete
// event with its fields (an instant for a mark), and the caller's and
// callee's spans of one call are linked by a flow.
BOOST_AUTO_TEST_CASE(events_tracks_and_flows, *utf::timeout(30)) {
  const auto doc = json::parse(cs::timeline_json(two_ranks()));
  std::vector<std::string> processes, threads;
  for (const auto& m : phase(doc, "M")) {
    if (m.at("name") == "process_name")
      processes.push_back(std::to_string(m.at("pid").get<int>()) + "=" + m.at("args").at("name").get<std::string>());
    if (m.at("name") == "thread_name")
      threads.push_back(std::to_string(m.at("pid").get<int>()) + "=" + m.at("args").at("name").get<std::string>());
  }
  BOOST_TEST((processes == std::vector<std::string>{"0=rank 0", "1=rank 1"}));
  for (const char* t : {"0=rpc w0", "0=ddp reducer 9/marks", "1=rpc w1", "1=store 127.0.0.1:1"})
    BOOST_TEST((std::find(threads.begin(), threads.end(), t) != threads.end()), t);

  const auto call = named(doc, "call load");
  BOOST_REQUIRE(!call.is_null());
  BOOST_TEST(call.at("ph") == "X");
  BOOST_TEST(call.at("pid") == 0);
  BOOST_TEST(call.at("args").at("peer") == "w1");
  BOOST_TEST(call.at("args").at("seq") == 5);
  BOOST_TEST(call.at("args").at("bytes") == 12);
  BOOST_TEST(call.at("args").at("state") == "completed");
  BOOST_TEST(call.at("dur").get<double>() >= 0.0);
  const auto serve = named(doc, "serve load");
  BOOST_REQUIRE(!serve.is_null());
  BOOST_TEST(serve.at("pid") == 1);
  const auto failed = named(doc, "get k");
  BOOST_REQUIRE(!failed.is_null());
  BOOST_TEST(failed.at("args").at("state") == "failed");
  BOOST_TEST(failed.at("args").at("error") == "no key");
  BOOST_TEST(failed.at("args").at("error_type") == "timeout");
  const auto waiting = named(doc, "wait barrier/2"); // still running: until its rank's dump
  BOOST_REQUIRE(!waiting.is_null());
  BOOST_TEST(waiting.at("args").at("state") == "started");
  const auto mark = named(doc, "mark 3");
  BOOST_REQUIRE(!mark.is_null());
  BOOST_TEST(mark.at("ph") == "i");

  const auto starts = phase(doc, "s");
  const auto ends = phase(doc, "f");
  BOOST_REQUIRE_EQUAL(starts.size(), 1u);
  BOOST_REQUIRE_EQUAL(ends.size(), 1u);
  BOOST_TEST(starts[0].at("id") == ends[0].at("id"));
  BOOST_TEST(starts[0].at("pid") == 0);
  BOOST_TEST(starts[0].at("tid") == call.at("tid"));
  BOOST_TEST(starts[0].at("ts") == call.at("ts"));
  BOOST_TEST(ends[0].at("pid") == 1);
  BOOST_TEST(ends[0].at("tid") == serve.at("tid"));
  BOOST_TEST(ends[0].at("ts") == serve.at("ts"));
  BOOST_TEST(ends[0].at("bp") == "e");
}

// A rank's clock offset moves its events by that much, and the file states it.
BOOST_AUTO_TEST_CASE(clock_offsets_are_applied_and_stated, *utf::timeout(30)) {
  auto dumps = two_ranks();
  const auto plain = json::parse(cs::timeline_json(dumps));
  const double gap = named(plain, "serve load").at("ts").get<double>() - named(plain, "call load").at("ts").get<double>();
  dumps[1].clock_offset = 5s; // rank 1's clock is 5 s ahead of the collector's
  dumps[1].offset_error = 300us;
  const auto moved = json::parse(cs::timeline_json(dumps));
  const double gap2 = named(moved, "serve load").at("ts").get<double>() - named(moved, "call load").at("ts").get<double>();
  BOOST_TEST(gap2 == gap - 5e6, boost::test_tools::tolerance(1e-3));
  const auto& ranks = moved.at("otherData").at("ranks");
  BOOST_REQUIRE_EQUAL(ranks.size(), 2u);
  BOOST_TEST(ranks[1].at("rank") == 1);
  BOOST_TEST(ranks[1].at("clock_offset_ns") == 5'000'000'000LL);
  BOOST_TEST(ranks[1].at("offset_error_ns") == 300'000);
  BOOST_TEST(ranks[0].at("clock_offset_ns") == 0);
  // The origin is the earliest event, on the collector's clock.
  BOOST_TEST(moved.at("otherData").at("time_origin_unix_ns").get<std::int64_t>() <
             plain.at("otherData").at("time_origin_unix_ns").get<std::int64_t>());
}

// Only entries that overlap the window are events; a missing or corrupt dump
// is listed with its problem and hurts no other rank.
BOOST_AUTO_TEST_CASE(window_and_bad_dumps, *utf::timeout(30)) {
  auto dumps = two_ranks();
  // The window starts just after rank 1's "get" ended: only its pending wait overlaps.
  const auto doc1 = json::parse(dumps[1].json);
  std::int64_t get_end = 0;
  for (const auto& r : doc1.at("recorders"))
    for (const auto& e : r.at("entries"))
      if (e.at("op") == "get")
        get_end = e.at("ended_ns").get<std::int64_t>() - doc1.at("steady_ns").get<std::int64_t>() +
                  doc1.at("unix_ns").get<std::int64_t>();
  BOOST_REQUIRE(get_end != 0);
  cs::timeline_window w;
  w.from = std::chrono::system_clock::time_point(std::chrono::nanoseconds(get_end + 1));
  dumps.push_back(cs::rank_dump{.rank = 2, .json = "{\"recorders\": [", .problem = ""});
  dumps.push_back(cs::rank_dump{.rank = 3, .json = "", .problem = "did not answer within 5000 ms"});
  const auto doc = json::parse(cs::timeline_json(dumps, w));
  BOOST_TEST(named(doc, "get k").is_null());
  BOOST_TEST(!named(doc, "wait barrier/2").is_null());
  BOOST_TEST(named(doc, "serve load").is_null()); // ended before the get
  BOOST_TEST(doc.at("otherData").at("window_from_unix_ns") == get_end + 1);
  const auto& ranks = doc.at("otherData").at("ranks");
  BOOST_REQUIRE_EQUAL(ranks.size(), 4u);
  BOOST_TEST(ranks[2].at("problem").get<std::string>().find("does not parse") != std::string::npos);
  BOOST_TEST(ranks[3].at("problem") == "did not answer within 5000 ms");
  for (const auto& m : phase(doc, "M"))
    BOOST_TEST(m.at("pid").get<int>() < 2);
}

// Spans of one recorder that overlap (calls in flight together) go on lanes
// of their own, so that the spans of every thread track nest (as both viewers
// want); spans that do not overlap share the first lane.
BOOST_AUTO_TEST_CASE(overlapping_spans_get_lanes, *utf::timeout(30)) {
  std::vector<cs::rank_dump> dumps;
  dumps.push_back(dump_of(0, [] {
    auto rpc = corodist::flight_recorder::create("rpc", "fan");
    const auto a = rpc->record({.op = "call", .detail = "a", .peer = "w1"});
    const auto b = rpc->record({.op = "call", .detail = "b", .peer = "w2"});
    const auto c = rpc->record({.op = "call", .detail = "c", .peer = "w3"});
    rpc->complete(a);
    rpc->complete(b);
    rpc->complete(c);
    rpc->complete(rpc->record({.op = "call", .detail = "d", .peer = "w1"})); // after all three
    return std::vector{rpc};
  }));
  const auto doc = json::parse(cs::timeline_json(dumps));
  std::map<int, std::string> tracks;
  for (const auto& m : phase(doc, "M"))
    if (m.at("name") == "thread_name")
      tracks[m.at("tid").get<int>()] = m.at("args").at("name").get<std::string>();
  std::vector<std::string> names;
  for (const auto& [tid, name] : tracks)
    names.push_back(name);
  BOOST_TEST((names == std::vector<std::string>{"rpc fan", "rpc fan (2)", "rpc fan (3)"}));
  std::map<int, std::vector<std::pair<double, double>>> by_tid;
  for (const auto& e : phase(doc, "X"))
    by_tid[e.at("tid").get<int>()].emplace_back(e.at("ts").get<double>(), e.at("ts").get<double>() + e.at("dur").get<double>());
  BOOST_TEST(by_tid.size() == 3u);
  for (auto& [tid, v] : by_tid) {
    std::sort(v.begin(), v.end());
    for (std::size_t i = 1; i < v.size(); ++i)
      BOOST_TEST(v[i].first >= v[i - 1].second, "track " << tracks[tid] << " has overlapping spans");
  }
  BOOST_TEST(named(doc, "call d").at("tid") == named(doc, "call a").at("tid")); // the first lane again
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(tcp_store_recorder)

// The client records each request (op, key, size) under "host:port", and a
// wait that times out as failed with kind "timeout".
BOOST_AUTO_TEST_CASE(requests_are_recorded_with_their_outcome, *utf::timeout(60)) {
  corodist::test::tcp_impl impl;
  cs::sync_store s(impl.make());
  s.set("alpha", "12345");
  BOOST_TEST(s.get("alpha") == "12345");
  BOOST_TEST(s.add("n", 2) == 2);
  BOOST_CHECK_THROW(s.wait({"beta", "gamma"}, std::chrono::milliseconds(100)), corodist::timeout_error);
  const auto entries = corodist::test::recorded("store", "127.0.0.1:" + std::to_string(impl.port()));
  BOOST_REQUIRE_EQUAL(entries.size(), 4u);
  BOOST_TEST(entries[0].at("op") == "set");
  BOOST_TEST(entries[0].at("detail") == "alpha");
  BOOST_TEST(entries[0].at("bytes").get<std::uint64_t>() >= 10u); // key and value, at least
  BOOST_TEST(entries[1].at("op") == "get");
  BOOST_TEST(entries[2].at("op") == "add");
  BOOST_TEST(entries[2].at("detail") == "n");
  for (int i = 0; i < 3; ++i)
    BOOST_TEST(entries[i].at("state") == "completed");
  BOOST_TEST(entries[3].at("op") == "wait");
  BOOST_TEST(entries[3].at("detail") == "beta"); // the first of its keys
  BOOST_TEST(entries[3].at("state") == "failed");
  BOOST_TEST(entries[3].at("error_type") == "timeout");
  BOOST_TEST(entries[3].at("error").get<std::string>().find("gamma") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
