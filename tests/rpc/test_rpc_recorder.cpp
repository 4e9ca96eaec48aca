// The RPC agent's flight-recorder entries: a call on its caller ("call") and
// its callee ("serve"), linked by one flow id; failures with their kind.
// Linked into test_rpc (BOOST_TEST_MODULE is in test_rpc.cpp).
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/rpc/errors.hpp>

#include "rpc/rpc_fixtures.hpp"
#include "support/recorder_entries.hpp"

#include <string>

namespace utf = boost::unit_test;
namespace rpc = corodist::rpc;
using namespace std::chrono_literals;
using corodist::test::cluster;
using corodist::test::recorded;
using corodist::test::with_op;

BOOST_AUTO_TEST_SUITE(rpc_recorder)

// Both sides of one call: the caller's "call" (function, callee, request id,
// size) and the callee's "serve" (function, caller, the same request id),
// completed, with the same nonzero flow; another call has another flow.
BOOST_AUTO_TEST_CASE(caller_and_callee_share_the_flow, *utf::timeout(60)) {
  cluster c(3);
  BOOST_TEST(c[0].rpc_sync<int>("w1", "add", 1, 2) == 3);
  BOOST_TEST(c[0].rpc_sync<int>("w2", "add", 3, 4) == 7);
  const auto calls = with_op(recorded("rpc", "w0"), "call");
  const auto served = with_op(recorded("rpc", "w1"), "serve");
  BOOST_REQUIRE_EQUAL(calls.size(), 2u);
  BOOST_REQUIRE_EQUAL(served.size(), 1u);
  const auto& call = calls[0];
  const auto& serve = served[0];
  BOOST_TEST(call.at("detail") == "add");
  BOOST_TEST(call.at("peer") == "w1");
  BOOST_TEST(call.at("state") == "completed");
  BOOST_TEST(call.at("bytes").get<std::uint64_t>() > 0u);
  BOOST_TEST(serve.at("detail") == "add");
  BOOST_TEST(serve.at("peer") == "w0");
  BOOST_TEST(serve.at("state") == "completed");
  BOOST_TEST(call.at("flow").get<std::uint64_t>() != 0u);
  BOOST_TEST(call.at("flow") == serve.at("flow"));
  BOOST_TEST(call.at("seq").get<std::uint64_t>() != 0u);
  BOOST_TEST(call.at("seq") == serve.at("seq"));
  // The second call (to w2, the same request id on another connection) has its own flow.
  const auto served2 = with_op(recorded("rpc", "w2"), "serve");
  BOOST_REQUIRE_EQUAL(served2.size(), 1u);
  BOOST_TEST(calls[1].at("flow") == served2[0].at("flow"));
  BOOST_TEST(calls[1].at("flow") != call.at("flow"));
  c.shutdown_all();
}

// A call that fails is recorded failed on both sides, with the failure's
// kind: a function that throws ("remote" / "exception"), an unknown function,
// and a call past its deadline ("timeout", its callee still serving it).
BOOST_AUTO_TEST_CASE(failed_calls_are_recorded_with_their_kind, *utf::timeout(60)) {
  cluster c(2);
  BOOST_CHECK_THROW(c[0].rpc_sync<int>("w1", "fail", std::string("boom")), corodist::remote_error);
  BOOST_CHECK_THROW(c[0].rpc_sync<int>("w1", "no_such_function"), rpc::unknown_function_error);
  auto& log = corodist::test::sleeps();
  const int entered = log.entries();
  corodist::test::holds().close();
  BOOST_CHECK_THROW(c[0].rpc_sync<int>(100ms, "w1", "hold", 1), corodist::timeout_error);
  BOOST_TEST_REQUIRE(log.wait_entries(entered + 1));
  const auto calls = with_op(recorded("rpc", "w0"), "call");
  auto served = with_op(recorded("rpc", "w1"), "serve");
  BOOST_REQUIRE_EQUAL(calls.size(), 3u);
  BOOST_REQUIRE_EQUAL(served.size(), 3u);
  BOOST_TEST(calls[0].at("state") == "failed");
  BOOST_TEST(calls[0].at("error_type") == "remote");
  BOOST_TEST(calls[0].at("error").get<std::string>().find("boom") != std::string::npos);
  BOOST_TEST(served[0].at("state") == "failed");
  BOOST_TEST(served[0].at("error_type") == "exception");
  BOOST_TEST(calls[1].at("error_type") == "remote");
  BOOST_TEST(served[1].at("detail") == "no_such_function");
  BOOST_TEST(served[1].at("error_type") == "unknown_function");
  BOOST_TEST(calls[2].at("detail") == "hold");
  BOOST_TEST(calls[2].at("state") == "failed");
  BOOST_TEST(calls[2].at("error_type") == "timeout");
  BOOST_TEST(served[2].at("state") == "started"); // held on its callee
  BOOST_TEST(calls[2].at("flow") == served[2].at("flow"));
  const int left = log.exits();
  corodist::test::holds().open();
  BOOST_TEST_REQUIRE(log.wait_exits(left + 1));
  c.shutdown_all();
}

BOOST_AUTO_TEST_SUITE_END()
