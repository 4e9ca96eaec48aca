#define BOOST_TEST_MODULE corodist_collective
// collective/ without a network: 16-bit float conversions, buffer views,
// argument checks, the work handle.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/cuda_stream.hpp>
#include <corodist/collective/errors.hpp>
#include <corodist/collective/float16.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/collective/round_robin_group.hpp>
#include <corodist/collective/tensor_view.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>

#include "collective/gloo_fixtures.hpp"
#include "support/loop_helpers.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cc = corodist::collective;

BOOST_AUTO_TEST_SUITE(types)

// Every float16 value converts to float and back to itself (NaNs stay NaN);
// rounding is to nearest, ties to even, against a reference in double.
BOOST_AUTO_TEST_CASE(float16_round_trips_and_rounds_to_nearest_even) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float f = cc::float16::to_float(h);
    if (std::isnan(f)) {
      BOOST_TEST(std::isnan(cc::float16::to_float(cc::float16::from_float(f))));
      continue;
    }
    BOOST_TEST_REQUIRE(cc::float16::from_float(f) == h, "bits " << b);
  }
  BOOST_TEST(cc::float16::to_float(cc::float16::from_float(1.0f + 1.0f / 2048)) == 1.0f); // tie -> even
  BOOST_TEST(cc::float16::to_float(cc::float16::from_float(1.0f + 3.0f / 2048)) == 1.0f + 2.0f / 1024);
  BOOST_TEST(cc::float16::to_float(cc::float16::from_float(65504.0f)) == 65504.0f);
  BOOST_TEST(std::isinf(cc::float16::to_float(cc::float16::from_float(65520.0f))));
  BOOST_TEST(cc::float16::to_float(cc::float16::from_float(5.96e-8f)) == std::ldexp(1.0f, -24)); // smallest subnormal
  BOOST_TEST(cc::float16::to_float(cc::float16::from_float(2.9e-8f)) == 0.0f);
  BOOST_TEST(cc::float16::from_float(-0.0f) == 0x8000);
  // Random floats: the result is one of the two neighbours, the nearer one.
  std::uint32_t x = 12345;
  for (int i = 0; i < 100000; ++i) {
    x = x * 1664525u + 1013904223u;
    const float f = std::ldexp(static_cast<float>(x >> 8) / 16777216.0f, static_cast<int>(x % 40) - 25);
    const double got = cc::float16::to_float(cc::float16::from_float(f));
    const auto lo = cc::float16::from_float(f);
    const double up = cc::float16::to_float(static_cast<std::uint16_t>(lo + 1));
    const double down = lo > 0 ? cc::float16::to_float(static_cast<std::uint16_t>(lo - 1)) : 0.0;
    BOOST_TEST_REQUIRE(std::fabs(got - f) <= std::min(std::fabs(up - f), std::fabs(down - f)), "float " << f);
  }
}

BOOST_AUTO_TEST_CASE(bfloat16_is_the_rounded_upper_half) {
  BOOST_TEST(cc::bfloat16::to_float(cc::bfloat16::from_float(1.0f)) == 1.0f);
  BOOST_TEST(cc::bfloat16::from_float(std::bit_cast<float>(0x3f808000u)) == 0x3f80); // tie -> even
  BOOST_TEST(cc::bfloat16::from_float(std::bit_cast<float>(0x3f818000u)) == 0x3f82); // tie -> even (up)
  BOOST_TEST(cc::bfloat16::from_float(std::bit_cast<float>(0x3f808001u)) == 0x3f81);
  BOOST_TEST(std::isnan(cc::bfloat16::to_float(cc::bfloat16::from_float(std::numeric_limits<float>::quiet_NaN()))));
  BOOST_TEST(std::isinf(cc::bfloat16::to_float(cc::bfloat16::from_float(std::numeric_limits<float>::max()))));
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const float f = cc::bfloat16::to_float(static_cast<std::uint16_t>(b));
    if (!std::isnan(f))
      BOOST_TEST_REQUIRE(cc::bfloat16::from_float(f) == b);
  }
}

BOOST_AUTO_TEST_CASE(tensor_views_carry_type_size_and_device) {
  std::vector<double> v(10);
  cc::tensor_view a(v);
  BOOST_TEST((a.type() == cc::dtype::float64));
  BOOST_TEST(a.count() == 10u);
  BOOST_TEST(a.bytes() == 80u);
  BOOST_TEST((a.where() == cc::device::cpu()));
  std::vector<cc::float16> h(4);
  cc::tensor_view b(std::span<cc::float16>(h), cc::device::cuda(1));
  BOOST_TEST((b.type() == cc::dtype::float16));
  BOOST_TEST(b.where().to_string() == "cuda:1");
  auto s = a.slice(2, 3);
  BOOST_TEST(s.data() == static_cast<void*>(v.data() + 2));
  BOOST_TEST(s.count() == 3u);
  BOOST_TEST(cc::to_string(cc::dtype::bfloat16) == "bfloat16");
  BOOST_TEST(cc::element_size(cc::dtype::uint8) == 1u);
  BOOST_TEST(cc::to_string(cc::reduce_op::product) == "product");
  BOOST_TEST(cc::to_string(cc::collective_kind::reduce_scatter) == "reduce_scatter");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(api, *utf::precondition(corodist::test::gloo_built))

using corodist::test::require_throws;

// Bad arguments throw usage_error at the call and issue nothing.
BOOST_AUTO_TEST_CASE(bad_arguments_throw_at_the_call_and_issue_nothing, *utf::timeout(60)) {
  corodist::test::thread_ranks job;
  auto errors = job.run(1, [&](int r) {
    auto pg = job.group(r, 1);
    std::vector<float> in(4), out(3);
    using usage = corodist::usage_error;
    require_throws<usage>([&] { (void)pg->allgather(in, out); }, "allgather: short output");
    require_throws<usage>([&] { (void)pg->reduce_scatter(in, out); }, "reduce_scatter: input not size x output");
    require_throws<usage>([&] { (void)pg->broadcast(in, 1); }, "broadcast: root out of range");
    require_throws<usage>([&] { (void)pg->broadcast(in, -1); }, "broadcast: negative root");
    std::vector<int> ints(4);
    require_throws<usage>([&] { (void)pg->allgather(ints, in); }, "allgather: dtypes differ");
    require_throws<usage>([&] { (void)pg->allreduce(cc::tensor_view(nullptr, 5, cc::dtype::float32)); },
                          "allreduce: null data");
    if (!cc::cuda_stream::unavailable_reason().empty()) { // CUDA buffers are staged where CUDA runs
      auto msg = require_throws<cc::cuda_error>(
          [&] { (void)pg->allreduce(cc::tensor_view(in.data(), 4, cc::dtype::float32, cc::device::cuda(0))); },
          "allreduce: device buffer on gloo without CUDA");
      RANK_REQUIRE(msg.find("CUDA cannot be used") != std::string::npos);
    }
    require_throws<usage>([&] { (void)pg->allreduce(in, cc::reduce_op::sum, {.timeout = -1ms}); },
                          "allreduce: a zero timeout");
    RANK_REQUIRE(pg->sequence_number() == 0u); // nothing was issued
    // A group of one: every collective is local and exact.
    in = {1, 2, 3, 4};
    pg->allreduce(in, cc::reduce_op::avg).get();
    RANK_REQUIRE((in == std::vector<float>{1, 2, 3, 4}));
    std::vector<float> gathered(4);
    pg->allgather(in, gathered).get();
    RANK_REQUIRE(gathered == in);
    pg->reduce_scatter(in, gathered).get();
    RANK_REQUIRE(gathered == in);
    RANK_REQUIRE(pg->sequence_number() == 3u);
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

// The work handle: get/wait from a plain thread, co_await on a loop (and
// refusal to block there), timing, sequence numbers.
BOOST_AUTO_TEST_CASE(work_handle_from_threads_and_coroutines, *utf::timeout(60)) {
  corodist::test::thread_ranks job;
  std::promise<void> gave_up;
  auto gave_up_f = gave_up.get_future().share();
  auto errors = job.run(2, [&](int r) {
    auto pg = job.group(r, 2);
    std::vector<float> v(1000, 1.0f);
    auto w = pg->allreduce(v);
    RANK_REQUIRE(w.valid());
    RANK_REQUIRE(w.seq() == 0u);
    RANK_REQUIRE(w.op() == "allreduce");
    w.wait(10s);
    RANK_REQUIRE(w.is_completed());
    RANK_REQUIRE(!w.exception());
    RANK_REQUIRE(w.duration().count() > 0);
    RANK_REQUIRE(v[999] == 2.0f);
    w.get(); // again: fine
    // A collective that cannot finish yet: rank 1 enters its barrier only
    // after rank 0's wait() has given up.
    if (r == 0) {
      auto b = pg->barrier();
      require_throws<corodist::timeout_error>([&] { b.wait(50ms); }, "wait(50ms) on a pending barrier");
      RANK_REQUIRE(!b.is_completed());
      gave_up.set_value();
      b.get();
    } else {
      RANK_REQUIRE(gave_up_f.wait_for(20s) == std::future_status::ready);
      pg->barrier().get();
    }
    // co_await on an event loop; blocking there is refused.
    corodist::event_loop loop;
    loop.start();
    auto on_loop = corodist::run_blocking(loop.get_executor(), [&]() -> asio::awaitable<bool> {
      std::vector<float> x(10, static_cast<float>(r));
      auto pending = pg->allreduce(x, cc::reduce_op::max);
      bool refused = pending.is_completed(); // finished too quickly to tell: nothing to check
      if (!refused) {
        try {
          pending.get();
        } catch (const corodist::usage_error&) {
          refused = true;
        }
      }
      co_await std::move(pending);
      co_await pg->barrier();
      co_return refused && x[0] == 1.0f && loop.running_in_this_thread();
    }());
    RANK_REQUIRE(on_loop);
    RANK_REQUIRE(pg->sequence_number() == 4u);
    cc::work invalid;
    RANK_REQUIRE(!invalid.valid());
    require_throws<corodist::usage_error>([&] { invalid.get(); }, "get() on an invalid work");
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

BOOST_AUTO_TEST_CASE(round_robin_refuses_mismatched_groups, *utf::timeout(60)) {
  BOOST_CHECK_THROW(cc::round_robin_group({}), corodist::usage_error);
  BOOST_CHECK_THROW(cc::round_robin_group({nullptr}), corodist::usage_error);
  corodist::test::thread_ranks job;
  auto errors = job.run(2, [&](int r) {
    std::shared_ptr<cc::process_group> pair = job.group(r, 2, corodist::test::gloo_test_options("pair"));
    if (r == 0) {
      std::shared_ptr<cc::process_group> solo = job.group(0, 1, corodist::test::gloo_test_options("solo"));
      auto msg = require_throws<corodist::usage_error>([&] { cc::round_robin_group rr({pair, solo}); },
                                                       "round robin over groups of different sizes");
      RANK_REQUIRE(msg.find("rank 0 of 1") != std::string::npos);
      cc::round_robin_group rr({pair, pair});
      RANK_REQUIRE(rr.backend() == "round_robin");
    }
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

BOOST_AUTO_TEST_SUITE_END()
