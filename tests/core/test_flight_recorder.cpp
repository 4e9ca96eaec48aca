// corodist::flight_recorder: the ring, its states, its JSON document.
// Linked into test_core (BOOST_TEST_MODULE is in test_core.cpp).
#include <boost/test/unit_test.hpp>

#include <corodist/core/flight_recorder.hpp>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

namespace utf = boost::unit_test;
using corodist::record_state;

BOOST_AUTO_TEST_SUITE(flight_recorder)

// Each operation goes from queued or started to completed or failed, with its
// fields and times; the ring keeps the newest `capacity` entries, oldest first.
BOOST_AUTO_TEST_CASE(ring_keeps_newest_entries_with_states, *utf::timeout(20)) {
  auto rec = corodist::flight_recorder::create("test", "ring", {.capacity = 4});
  BOOST_REQUIRE(rec); // CORODIST_RECORDER is not 0 in the tests
  const auto a = rec->record({.seq = 1, .op = "allreduce", .detail = "float32 x 1000, sum", .peer = "ranks 0-3",
                              .where = "train.cpp:42", .bytes = 4000, .started = false});
  const auto b = rec->record({.seq = 2, .op = "broadcast", .detail = "int64 x 3, root 0"});
  rec->start(a);
  rec->complete(a);
  rec->fail(b, "rank 2 lost");
  auto e = rec->entries();
  BOOST_REQUIRE_EQUAL(e.size(), 2u);
  BOOST_TEST(e[0].op == "allreduce");
  BOOST_TEST(e[0].where == "train.cpp:42");
  BOOST_TEST(e[0].bytes == 4000u);
  BOOST_TEST((e[0].state == record_state::completed));
  BOOST_TEST((e[0].started >= e[0].queued && e[0].ended >= e[0].started));
  BOOST_TEST((e[1].state == record_state::failed));
  BOOST_TEST(e[1].error == "rank 2 lost");
  // An ended entry stays as it ended.
  rec->complete(b);
  BOOST_TEST((rec->entries()[1].state == record_state::failed));

  for (int i = 0; i < 5; ++i)
    rec->record({.seq = std::uint64_t(10 + i), .op = "barrier"});
  e = rec->entries();
  BOOST_REQUIRE_EQUAL(e.size(), 4u);
  BOOST_TEST(e.front().seq == 11u);
  BOOST_TEST(e.back().seq == 14u);
  BOOST_TEST(rec->recorded() == 7u);
  // A handle whose slot was overwritten changes nothing.
  rec->fail(a, "late");
  for (const auto& x : rec->entries())
    BOOST_TEST((x.state == record_state::started));
  BOOST_TEST(rec->pending().size() == 4u);
  rec->complete(rec->entries().back().id);
  BOOST_TEST(rec->pending().size() == 3u);
}

// The process's document lists every live recorder (and forgets a destroyed
// one), with states, ages and both clocks.
BOOST_AUTO_TEST_CASE(dump_lists_live_recorders, *utf::timeout(20)) {
  auto one = corodist::flight_recorder::create("collective", "dump-one");
  auto two = corodist::flight_recorder::create("rpc", "dump-two");
  one->record({.seq = 7, .op = "allreduce", .detail = "quote \" and \xff byte"});
  const auto h = two->record({.seq = 1, .op = "call", .detail = "load", .peer = "w1"});
  two->complete(h);
  corodist::set_flight_recorder_label("rank 5");
  auto doc = nlohmann::json::parse(corodist::dump_flight_recorders());
  BOOST_TEST(doc["label"] == "rank 5");
  BOOST_TEST(doc["unix_ns"].get<std::int64_t>() > 0);
  int found = 0;
  for (const auto& r : doc["recorders"]) {
    if (r["name"] == "dump-one") {
      ++found;
      BOOST_TEST(r["layer"] == "collective");
      BOOST_TEST(r["entries"][0]["state"] == "started");
      BOOST_TEST(r["entries"][0]["seq"] == 7);
      BOOST_TEST(r["entries"][0]["ended_ns"] == 0);
    }
    if (r["name"] == "dump-two") {
      ++found;
      BOOST_TEST(r["entries"][0]["state"] == "completed");
      BOOST_TEST(r["entries"][0]["peer"] == "w1");
      BOOST_TEST(r["entries"][0]["age_ms"].get<double>() >= 0.0);
    }
  }
  BOOST_TEST(found == 2);
  two.reset();
  doc = nlohmann::json::parse(corodist::dump_flight_recorders());
  for (const auto& r : doc["recorders"])
    BOOST_TEST(r["name"] != "dump-two");
}

// The observer sees every ended entry once; records from many threads all land.
BOOST_AUTO_TEST_CASE(observer_and_threads, *utf::timeout(20)) {
  auto rec = corodist::flight_recorder::create("test", "threads", {.capacity = 4096});
  std::atomic<int> seen{0};
  corodist::flight_recorder::set_observer([&](const corodist::flight_recorder& r, const corodist::record_entry& e) {
    if (&r == rec.get() && e.state == record_state::completed)
      seen.fetch_add(1);
  });
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 500; ++i)
        rec->complete(rec->record({.op = "get", .detail = "key"}));
    });
  for (auto& t : ts)
    t.join();
  corodist::flight_recorder::set_observer(nullptr);
  BOOST_TEST(seen.load() == 2000);
  BOOST_TEST(rec->recorded() == 2000u);
}

// A timeout's dump goes to CORODIST_RECORDER_DUMP_DIR as JSON.
BOOST_AUTO_TEST_CASE(dump_file_on_request, *utf::timeout(20)) {
  const auto dir = std::filesystem::temp_directory_path() / ("corodist-rec-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ::setenv("CORODIST_RECORDER_DUMP_DIR", dir.c_str(), 1);
  auto rec = corodist::flight_recorder::create("test", "file");
  rec->record({.op = "wait", .detail = "k"});
  const std::string path = corodist::write_flight_recorder_dump("test timeout");
  ::unsetenv("CORODIST_RECORDER_DUMP_DIR");
  BOOST_REQUIRE(!path.empty());
  BOOST_TEST(std::filesystem::path(path).parent_path() == dir);
  std::ifstream in(path);
  const auto doc = nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  BOOST_TEST(doc["recorders"].is_array());
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_SUITE_END()
