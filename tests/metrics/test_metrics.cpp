// corodist::metrics: a process's endpoint scraped over HTTP from 127.0.0.1,
// counting what the flight recorders see (RPC calls per function with errors
// by type, store operations, collectives by size class), the reducer's
// figures, the net layer's connection counts (a silent peer: a missed
// heartbeat, a lost connection); the node's merged exposition with a rank
// label; corodist-run --metrics-port with two real ranks. Every scraped text
// is validated by `promtool check metrics`. Counts are process-wide: each
// test compares a scrape before and after what it does.
#define BOOST_TEST_MODULE corodist_metrics
#include <boost/test/unit_test.hpp>

#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/flight_recorder.hpp>
#include <corodist/ddp/parameter.hpp>
#include <corodist/ddp/reducer.hpp>
#include <corodist/metrics/metrics_server.hpp>
#include <corodist/metrics/node_metrics.hpp>
#include <corodist/metrics/reducer_metrics.hpp>
#include <corodist/net/connection.hpp>
#include <corodist/net/frame.hpp>
#include <corodist/net/listener.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/sync_store.hpp>
#include <corodist/store/tcp_store.hpp>

#include "collective/gloo_fixtures.hpp"
#include "metrics/metrics_fixtures.hpp"
#include "rpc/rpc_fixtures.hpp"
#include "support/loop_helpers.hpp"
#include "support/program.hpp"

#include <asio/post.hpp>
#include <asio/write.hpp>

#include <csignal>
#include <future>
#include <regex>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace metrics = corodist::metrics;
namespace net = corodist::net;
namespace cs = corodist::store;
using corodist::test::label_set;
using corodist::test::require_valid_exposition;
using corodist::test::sum_of;

namespace {

/// This process's endpoint (started once; later calls return its port).
std::uint16_t serving() { return metrics::metrics_server::start(0); }

/// GET /metrics of this process, over HTTP.
std::string scrape() { return metrics::fetch_metrics("127.0.0.1", serving(), 10s); }

/// `after` minus `before` for one sum of samples (a missing one counts 0).
double delta(const std::string& before, const std::string& after, const std::string& name, const label_set& l = {}) {
  return sum_of(after, name, l).value_or(0) - sum_of(before, name, l).value_or(0);
}

} // namespace

BOOST_AUTO_TEST_SUITE(metrics_server)

// Entries that real recorders of each layer end are counted by layer, with
// their labels; failures by type; latencies in histograms; collectives by size
// class with their bytes. The text is valid for promtool.
BOOST_AUTO_TEST_CASE(recorder_entries_become_series, *utf::timeout(60)) {
  serving();
  const auto before = scrape();
  auto rpc = corodist::flight_recorder::create("rpc", "metrics-test");
  auto store = corodist::flight_recorder::create("store", "metrics-test");
  auto coll = corodist::flight_recorder::create("collective", "metrics-test");
  BOOST_REQUIRE(rpc && store && coll); // CORODIST_RECORDER is not 0 in the tests
  for (int i = 0; i < 10; ++i)
    rpc->complete(rpc->record({.op = "call", .detail = "metrics_test_add", .peer = "w1"}));
  rpc->fail(rpc->record({.op = "call", .detail = "metrics_test_add", .peer = "w1"}), "w1 is gone", "peer_lost");
  rpc->fail(rpc->record({.op = "serve", .detail = "metrics_test_add"}), "bad arguments", "bad_arguments");
  store->complete(store->record({.op = "metrics_test_get", .detail = "k"}));
  coll->complete(coll->record({.op = "metrics_test_allreduce", .bytes = 4096}));
  coll->complete(coll->record({.op = "metrics_test_allreduce", .bytes = 4097}));
  coll->fail(coll->record({.op = "metrics_test_allreduce", .bytes = 1 << 20}), "timed out", "timeout");
  const auto after = scrape();

  const label_set caller{{"side", "caller"}, {"function", "metrics_test_add"}};
  BOOST_TEST(delta(before, after, "corodist_rpc_calls_total", caller) == 11);
  BOOST_TEST(delta(before, after, "corodist_rpc_call_duration_seconds_count", caller) == 11);
  BOOST_TEST(delta(before, after, "corodist_rpc_call_errors_total",
                   {{"side", "caller"}, {"function", "metrics_test_add"}, {"type", "peer_lost"}}) == 1);
  BOOST_TEST(delta(before, after, "corodist_rpc_call_errors_total",
                   {{"side", "callee"}, {"function", "metrics_test_add"}, {"type", "bad_arguments"}}) == 1);
  BOOST_TEST(delta(before, after, "corodist_store_ops_total", {{"op", "metrics_test_get"}}) == 1);
  const label_set small{{"op", "metrics_test_allreduce"}, {"size_class", "<=4KiB"}};
  const label_set mid{{"op", "metrics_test_allreduce"}, {"size_class", "<=64KiB"}};
  const label_set big{{"op", "metrics_test_allreduce"}, {"size_class", "<=1MiB"}};
  BOOST_TEST(delta(before, after, "corodist_collective_ops_total", small) == 1);
  BOOST_TEST(delta(before, after, "corodist_collective_bytes_total", small) == 4096);
  BOOST_TEST(delta(before, after, "corodist_collective_bytes_total", mid) == 4097);
  BOOST_TEST(delta(before, after, "corodist_collective_ops_total", big) == 1);
  BOOST_TEST(delta(before, after, "corodist_collective_errors_total",
                   {{"op", "metrics_test_allreduce"}, {"type", "timeout"}}) == 1);
  // Every observation is in the +Inf bucket of its histogram.
  BOOST_TEST(delta(before, after, "corodist_collective_duration_seconds_bucket",
                   {{"op", "metrics_test_allreduce"}, {"le", "+Inf"}}) == 3);
  require_valid_exposition(after);
}

// Real RPC calls between two agents: calls of "add" counted on both sides,
// a failing function counted as an error with its type.
BOOST_AUTO_TEST_CASE(rpc_calls_by_function_and_error_type, *utf::timeout(60)) {
  serving();
  corodist::test::cluster c(2);
  if (!corodist::test::layer_records("rpc")) {
    BOOST_WARN_MESSAGE(false, "the rpc layer of this build records no calls: nothing to count");
    c.shutdown_all();
    return;
  }
  const auto before = scrape();
  for (int i = 0; i < 10; ++i)
    BOOST_TEST(c[0].rpc_sync<int>("w1", "add", i, 1) == i + 1);
  BOOST_CHECK_THROW(c[0].rpc_sync<int>("w1", "fail", std::string("boom")), corodist::remote_error);
  const auto after = scrape();
  c.shutdown_all();
  BOOST_TEST(delta(before, after, "corodist_rpc_calls_total", {{"side", "caller"}, {"function", "add"}}) == 10);
  BOOST_TEST(delta(before, after, "corodist_rpc_calls_total", {{"side", "callee"}, {"function", "add"}}) == 10);
  BOOST_TEST(delta(before, after, "corodist_rpc_call_duration_seconds_count",
                   {{"side", "caller"}, {"function", "add"}}) == 10);
  BOOST_TEST(delta(before, after, "corodist_rpc_call_errors_total", {{"side", "caller"}, {"function", "fail"}}) == 1);
  for (const auto& s : corodist::test::parse_samples(after))
    if (s.name == "corodist_rpc_call_errors_total" && s.labels.count("function") && s.labels.at("function") == "fail")
      BOOST_TEST_MESSAGE("error type of a remote failure: " << s.labels.at("type"));
  require_valid_exposition(after);
}

// Real store operations on a TCP store: sets and gets counted per operation,
// a get that times out counted as an error.
BOOST_AUTO_TEST_CASE(store_operations_by_op, *utf::timeout(60)) {
  serving();
  corodist::event_loop loop;
  loop.start();
  cs::server_options so;
  auto server = cs::store_server::start(loop.get_executor(), so);
  cs::tcp_store_options o;
  o.port = server->local_endpoint().port();
  o.auth_token = std::string();
  o.timeout = 10s;
  cs::sync_store s(cs::tcp_store::connect_sync(loop.get_executor(), o));
  if (!corodist::test::layer_records("store")) {
    BOOST_WARN_MESSAGE(false, "the store layer of this build records no operations: nothing to count");
    return;
  }
  const auto before = scrape();
  for (int i = 0; i < 5; ++i)
    s.set("k" + std::to_string(i), "v");
  for (int i = 0; i < 5; ++i)
    BOOST_TEST(s.get("k" + std::to_string(i)) == "v");
  BOOST_CHECK_THROW(s.get("never-set", corodist::timeout::after(50ms)), corodist::timeout_error);
  const auto after = scrape();
  BOOST_TEST(delta(before, after, "corodist_store_ops_total", {{"op", "set"}}) == 5);
  BOOST_TEST(delta(before, after, "corodist_store_ops_total", {{"op", "get"}}) == 6);
  BOOST_TEST(delta(before, after, "corodist_store_op_errors_total", {{"op", "get"}}) == 1);
  require_valid_exposition(after);
}

// A 4 KiB Gloo allreduce on two thread ranks: counted per rank (both ranks are
// this process) in its size class, with its bytes.
BOOST_AUTO_TEST_CASE(gloo_allreduce_by_size_class, *utf::timeout(60) *
                                                       utf::precondition(corodist::test::gloo_built)) {
  serving();
  corodist::test::thread_ranks job;
  std::vector<std::shared_ptr<corodist::collective::gloo_group>> groups(2);
  corodist::test::require_all_ok(job.run(2, [&](int r) { groups[static_cast<std::size_t>(r)] = job.group(r, 2); }));
  if (!corodist::test::layer_records("collective")) {
    BOOST_WARN_MESSAGE(false, "the collective layer of this build records no collectives: nothing to count");
    return;
  }
  const auto before = scrape();
  corodist::test::require_all_ok(job.run(2, [&](int r) {
    std::vector<float> v(1024, 1.0f);
    for (int i = 0; i < 3; ++i)
      groups[static_cast<std::size_t>(r)]->allreduce(corodist::collective::tensor_view(v)).get();
    if (v[0] != 8.0f)
      throw std::runtime_error("allreduce: " + std::to_string(v[0]));
  }));
  const auto after = scrape();
  const label_set l{{"op", "allreduce"}, {"size_class", "<=4KiB"}};
  BOOST_TEST(delta(before, after, "corodist_collective_ops_total", l) == 6);
  BOOST_TEST(delta(before, after, "corodist_collective_bytes_total", l) == 6 * 4096);
  BOOST_TEST(delta(before, after, "corodist_collective_duration_seconds_count", l) == 6);
  require_valid_exposition(after);
}

// The reducer's hook: iterations, overlap (last iteration's ratio), per-bucket
// ready-to-done histograms.
BOOST_AUTO_TEST_CASE(reducer_iterations, *utf::timeout(30)) {
  serving();
  BOOST_REQUIRE(metrics::counting());
  const auto before = scrape();
  const std::vector<std::chrono::nanoseconds> buckets{2ms, 3ms};
  metrics::note_reducer_iteration({buckets, 10ms, 7500us, 1ms});
  const auto after = scrape();
  BOOST_TEST(delta(before, after, "corodist_ddp_iterations_total") == 1);
  BOOST_TEST(sum_of(after, "corodist_ddp_overlap_ratio").value_or(-1) == 0.75);
  BOOST_TEST(delta(before, after, "corodist_ddp_bucket_ready_to_done_seconds_count", {{"bucket", "1"}}) == 1);
  BOOST_TEST(delta(before, after, "corodist_ddp_bucket_ready_to_done_seconds_sum", {{"bucket", "1"}}) ==
             0.003, boost::test_tools::tolerance(1e-9));
  require_valid_exposition(after);
}

// A real reducer on two thread ranks (Gloo): each synchronized iteration of
// each rank hands its figures to the metrics: iterations, one ready-to-done
// observation per bucket, the overlap of the last one.
BOOST_AUTO_TEST_CASE(reducer_on_two_ranks_feeds_its_iterations, *utf::timeout(120) *
                                                                    utf::precondition(corodist::test::gloo_built)) {
  serving();
  const auto before = scrape();
  corodist::test::thread_ranks job;
  std::vector<std::size_t> bucket_counts(2);
  corodist::test::require_all_ok(job.run(2, [&](int r) {
    std::vector<std::vector<float>> values{std::vector<float>(300, 1.0f), std::vector<float>(200, 1.0f)};
    std::vector<std::vector<float>> grads{std::vector<float>(300), std::vector<float>(200)};
    std::vector<corodist::ddp::parameter> ps;
    for (std::size_t k = 0; k < values.size(); ++k)
      ps.emplace_back(std::span<float>(values[k]), std::span<float>(grads[k]), "p" + std::to_string(k));
    corodist::ddp::reducer_options o;
    o.bucket_cap_bytes = 1024;
    o.first_bucket_bytes = 512;
    o.rebuild_buckets = false;
    corodist::ddp::reducer red(job.group(r, 2), ps, o);
    bucket_counts[static_cast<std::size_t>(r)] = red.layout().buckets.size();
    for (int it = 0; it < 3; ++it) {
      red.prepare_for_backward();
      for (std::size_t k = grads.size(); k-- > 0;) {
        std::fill(grads[k].begin(), grads[k].end(), static_cast<float>(r + 1));
        red.mark_grad_ready(k);
      }
      red.finalize_sync();
    }
  }));
  const auto after = scrape();
  BOOST_REQUIRE(bucket_counts[0] == 2u); // 800 B then 1200 B: the first bucket holds 512 B at most
  BOOST_TEST(delta(before, after, "corodist_ddp_iterations_total") == 6);
  for (std::size_t b = 0; b < bucket_counts[0]; ++b)
    BOOST_TEST(delta(before, after, "corodist_ddp_bucket_ready_to_done_seconds_count", {{"bucket", std::to_string(b)}}) ==
                   6,
               "bucket " << b << " of " << bucket_counts[0]);
  BOOST_TEST(delta(before, after, "corodist_ddp_communication_seconds_total") > 0);
  const double ratio = sum_of(after, "corodist_ddp_overlap_ratio").value_or(-1);
  BOOST_TEST((ratio >= 0 && ratio <= 1), ratio);
  require_valid_exposition(after);
}

// A client that says hello and then nothing: the server's wheel finds it
// silent past half its peer_timeout (a missed heartbeat), then drops it
// (a lost connection); the open and closed counts move with it.
BOOST_AUTO_TEST_CASE(silent_peer_counts_a_missed_heartbeat_and_a_lost_connection, *utf::timeout(60)) {
  serving();
  const auto before = scrape();
  corodist::event_loop loop;
  net::connection_options opts;
  opts.peer_timeout = 300ms;
  std::promise<std::error_code> dropped;
  std::promise<asio::ip::tcp::endpoint> ready;
  std::shared_ptr<net::listener> listener;
  asio::post(loop.get_executor(), [&] {
    auto [ec, l] = net::listener::listen(loop.get_executor(), {asio::ip::make_address("127.0.0.1"), 0}, opts,
                                         [&](std::shared_ptr<net::connection> c) {
                                           c->start([](const std::shared_ptr<net::connection>&, net::message&&) {},
                                                    [&](std::error_code why) { dropped.set_value(why); });
                                         });
    listener = l;
    listener->start();
    ready.set_value(listener->local_endpoint());
  });
  loop.start();
  asio::io_context ctx;
  asio::ip::tcp::socket s(ctx);
  s.connect(ready.get_future().get());
  auto h = net::encode(net::hello{});
  asio::write(s, asio::buffer(h));
  auto f = dropped.get_future();
  BOOST_REQUIRE(f.wait_for(30s) == std::future_status::ready);
  BOOST_TEST((f.get() == net::errc::peer_timed_out));
  corodist::test::on_loop(loop, [&] { listener->close(); });
  const auto after = scrape();
  BOOST_TEST(delta(before, after, "corodist_connections_opened_total") >= 1);
  BOOST_TEST(delta(before, after, "corodist_connections_closed_total") >= 1);
  BOOST_TEST(delta(before, after, "corodist_connections_lost_total") >= 1);
  BOOST_TEST(delta(before, after, "corodist_heartbeats_missed_total") >= 1);
  require_valid_exposition(after);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(node_metrics)

// Two ranks' texts become one: a rank label first on every sample, each
// family's HELP and TYPE once, its samples together; valid for promtool.
BOOST_AUTO_TEST_CASE(merged_expositions_carry_the_rank, *utf::timeout(30)) {
  serving();
  const auto text = metrics::scrape_text();
  const auto merged = metrics::merge_expositions({{0, text}, {1, text}});
  std::size_t helps = 0;
  for (std::size_t at = 0; (at = merged.find("# TYPE corodist_connections_opened_total ", at)) != std::string::npos;
       ++at)
    ++helps;
  BOOST_TEST(helps == 1u);
  const auto one = sum_of(text, "corodist_connections_opened_total");
  BOOST_REQUIRE(one);
  BOOST_TEST(sum_of(merged, "corodist_connections_opened_total", {{"rank", "0"}}).value_or(-1) == *one);
  BOOST_TEST(sum_of(merged, "corodist_connections_opened_total", {{"rank", "1"}}).value_or(-1) == *one);
  for (const auto& s : corodist::test::parse_samples(merged))
    BOOST_TEST(s.labels.count("rank") == 1u, s.name);
  require_valid_exposition(merged);
  // A line that is no sample is refused with a typed error.
  BOOST_CHECK_THROW(metrics::merge_expositions({{0, "no_value_here\n"}}), corodist::error);
}

// corodist-run --metrics-port 0 with two ranks: the launcher prints its port;
// a scrape there has both ranks' series, each with its rank label, in one
// valid exposition.
BOOST_AUTO_TEST_CASE(corodist_run_serves_every_local_rank, *utf::timeout(90)) {
  corodist::test::program job({CORODIST_RUN_PATH, "--nproc", "2", "--metrics-port", "0", "--",
                               CORODIST_TEST_RANK_PATH, "rdzv-hold"});
  std::uint16_t port = 0;
  int holding = 0;
  const std::regex serving_line(R"(metrics: every local rank's at http://127\.0\.0\.1:(\d+)/metrics)");
  while (port == 0 || holding < 2) {
    auto line = job.read_line(60s);
    BOOST_REQUIRE_MESSAGE(line, "corodist-run ended or fell silent before both ranks held");
    std::smatch m;
    if (std::regex_search(*line, m, serving_line))
      port = static_cast<std::uint16_t>(std::stoi(m[1]));
    if (line->find("holding") != std::string::npos)
      ++holding;
  }
  // Each rank wrote its port before it printed "holding" (at its store connection).
  const auto text = metrics::fetch_metrics("127.0.0.1", port, 10s);
  for (const char* rank : {"0", "1"}) {
    BOOST_TEST(sum_of(text, "corodist_connections_opened_total", {{"rank", rank}}).value_or(0) >= 1, rank);
    BOOST_TEST(sum_of(text, "corodist_connections_open", {{"rank", rank}}).has_value(), rank);
  }
  BOOST_TEST(!sum_of(text, "corodist_node_scrape_errors_total").has_value(), text);
  require_valid_exposition(text);
  // SIGTERM reaches the ranks; the launcher ends as stopped by it (and removes the ports folder).
  ::kill(job.pid(), SIGTERM);
  BOOST_TEST(job.wait(30s) == 128 + SIGTERM, job.output());
}

BOOST_AUTO_TEST_SUITE_END()
