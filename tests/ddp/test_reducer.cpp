#define BOOST_TEST_MODULE corodist_ddp
// The DDP reducer with ranks as real processes (fork) on Gloo over loopback,
// meeting at a store server in the test process.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/errors.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/ddp/default_hooks.hpp>
#include <corodist/ddp/errors.hpp>
#include <corodist/ddp/reducer.hpp>
#include <corodist/core/flight_recorder.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/tcp_store.hpp>

#include "collective/gloo_fixtures.hpp"
#include "ddp/grad_ops.hpp"
#include "ddp/reducer_fixtures.hpp"
#include "store/store_fixtures.hpp"
#include "support/child_process.hpp"
#include "support/program.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <type_traits>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cc = corodist::collective;
namespace cs = corodist::store;
namespace dd = corodist::ddp;
using corodist::event_loop;
using corodist::test::child_process;
using corodist::test::pipe_pair;
using namespace corodist::test::reducer_fixtures;

namespace {

using store_host = corodist::test::tcp_impl;

struct rank_env {
  int rank;
  int size;
  std::shared_ptr<cc::gloo_group> pg;
  std::shared_ptr<cs::store> store; // where the group met (a new group may meet there too)
};

/// Joins group `prefix` of `size` ranks at the store on `port`, runs `body`.
int rank_process(std::uint16_t port, int rank, int size, const std::string& prefix,
                 const std::function<int(rank_env&)>& body, std::chrono::milliseconds timeout) {
  event_loop loop;
  loop.start();
  cs::tcp_store_options o;
  o.port = port;
  o.auth_token = "";
  o.timeout = 20s;
  auto store = cs::tcp_store::connect_sync(loop.get_executor(), o);
  auto pg = cc::gloo_group::create_sync(store, rank, size, corodist::test::gloo_test_options(prefix, timeout));
  rank_env env{rank, size, pg, store};
  try {
    return body(env);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d of %d: %s\n", rank, size, e.what());
    return 1;
  }
}

/// Forks `size` rank processes of group `prefix`, then starts the store
/// server they meet at (in `host`) and tells them its port. Forking first,
/// while this process has no other thread: a fork while another thread
/// allocates leaves the child with that allocator lock held forever under
/// ASan (whose allocator, unlike glibc's, is not made safe across fork).
std::vector<std::unique_ptr<child_process>> start_ranks(std::unique_ptr<store_host>& host, int size,
                                                        const std::string& prefix,
                                                        const std::function<int(rank_env&)>& body,
                                                        std::chrono::milliseconds timeout) {
  pipe_pair go;
  std::vector<std::unique_ptr<child_process>> kids;
  for (int r = 0; r < size; ++r)
    kids.push_back(std::make_unique<child_process>([&, r] {
      std::uint16_t port = 0;
      if (!corodist::test::read_all(go.read_end(), &port, sizeof port))
        return 7;
      return rank_process(port, r, size, prefix, body, timeout);
    }));
  host = std::make_unique<store_host>();
  const std::uint16_t port = host->port();
  for (int r = 0; r < size; ++r)
    BOOST_REQUIRE(corodist::test::write_all(go.write_end(), &port, sizeof port));
  return kids;
}

std::vector<int> run_ranks(int size, const std::string& prefix, const std::function<int(rank_env&)>& body,
                           std::chrono::milliseconds timeout = 20s) {
  std::unique_ptr<store_host> host;
  auto kids = start_ranks(host, size, prefix, body, timeout);
  std::vector<int> codes;
  for (auto& k : kids)
    codes.push_back(k->wait_for(90s));
  return codes;
}

void require_all_zero(const std::vector<int>& codes) {
  for (std::size_t r = 0; r < codes.size(); ++r)
    BOOST_TEST(codes[r] == 0, "rank " << r << " exited with " << codes[r]);
}

bool wait_readable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

const std::vector<std::size_t> sizes = {300, 7, 1000, 64, 129, 5, 800, 33};

} // namespace

// Gradient copies (streamed from 1 MiB): every byte lands, whatever the
// alignment of either side and the size's remainder, and nothing around the
// destination is touched.
BOOST_AUTO_TEST_CASE(gradient_copies_are_exact_at_every_alignment) {
  const std::size_t mib = dd::detail::streaming_copy_min;
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, mib - 1, mib, mib + 63, 3 * mib + 17})
    for (std::size_t src_off : {0, 1, 8, 15})
      for (std::size_t dst_off : {0, 3, 16, 33}) {
        std::vector<std::byte> src(bytes + 64), dst(bytes + 128, std::byte{0xee});
        for (std::size_t i = 0; i < src.size(); ++i)
          src[i] = static_cast<std::byte>((i * 131 + bytes) & 0xff);
        dd::detail::copy_gradient(dst.data() + dst_off, src.data() + src_off, bytes);
        BOOST_TEST_REQUIRE(std::memcmp(dst.data() + dst_off, src.data() + src_off, bytes) == 0,
                           bytes << " bytes, source offset " << src_off << ", destination offset " << dst_off);
        for (std::size_t i = 0; i < dst_off; ++i)
          BOOST_TEST_REQUIRE((dst[i] == std::byte{0xee}));
        for (std::size_t i = dst_off + bytes; i < dst.size(); ++i)
          BOOST_TEST_REQUIRE((dst[i] == std::byte{0xee}));
      }
}

BOOST_AUTO_TEST_SUITE(ddp_reducer, *utf::precondition(corodist::test::gloo_built))

// The layout rule alone: reverse registration order, one dtype and device
// per bucket, each key's first bucket closing at the first cap and later
// ones at the cap, buckets ordered by their first parameter; bad orders refused.
BOOST_AUTO_TEST_CASE(bucket_layout_rule, *utf::timeout(10)) {
  std::vector<float> f(1000);
  std::vector<double> d(1000);
  auto fp = [&](std::size_t n) { return dd::parameter(f.data(), f.data(), n, cc::dtype::float32); };
  auto dp = [&](std::size_t n) { return dd::parameter(d.data(), d.data(), n, cc::dtype::float64); };
  // float32 x 100 = 400 B, float64 x 100 = 800 B.
  std::vector<dd::parameter> ps = {fp(100), dp(100), fp(100), fp(100), dp(100), fp(100), fp(100)};
  const auto l = dd::bucket_layout::compute(ps, {}, 400, 1000);
  BOOST_TEST_MESSAGE(l.to_string());
  // Reverse order: 6 5 4 3 2 1 0. float32: 6 (400 B >= first cap 400: closed) | 5 3 2 (1200 B >= 1000) | 0.
  // float64: 4 (800 B >= 400: closed) | 1. Ordered by first parameter's position: 6, 5.., 4, 1, 0.
  BOOST_REQUIRE_EQUAL(l.buckets.size(), 5u);
  BOOST_TEST(l.buckets[0].parameters == std::vector<std::size_t>({6}), boost::test_tools::per_element());
  BOOST_TEST(l.buckets[1].parameters == std::vector<std::size_t>({5, 3, 2}), boost::test_tools::per_element());
  BOOST_TEST(l.buckets[1].offsets == std::vector<std::size_t>({0, 100, 200}), boost::test_tools::per_element());
  BOOST_TEST(l.buckets[2].parameters == std::vector<std::size_t>({4}), boost::test_tools::per_element());
  BOOST_TEST(l.buckets[3].parameters == std::vector<std::size_t>({1}), boost::test_tools::per_element());
  BOOST_TEST(l.buckets[4].parameters == std::vector<std::size_t>({0}), boost::test_tools::per_element());
  for (const auto& b : l.buckets)
    for (auto p : b.parameters)
      BOOST_TEST((ps[p].type == b.type));
  BOOST_TEST(l.buckets[1].bytes() == 1200u);
  const auto bof = l.bucket_of(ps.size());
  BOOST_TEST(bof[3] == 1u);
  // Registration order given explicitly.
  const std::vector<std::size_t> forward = {0, 1, 2, 3, 4, 5, 6};
  const auto l2 = dd::bucket_layout::compute(ps, forward, 400, 1000);
  BOOST_TEST(l2.buckets[0].parameters == std::vector<std::size_t>({0}), boost::test_tools::per_element());
  const std::vector<std::size_t> dup = {0, 1, 2, 3, 4, 5, 5};
  BOOST_CHECK_THROW(dd::bucket_layout::compute(ps, dup, 400, 1000), corodist::usage_error);
  const std::vector<std::size_t> short_order = {0, 1};
  BOOST_CHECK_THROW(dd::bucket_layout::compute(ps, short_order, 400, 1000), corodist::usage_error);
}

// Three ranks (an odd world), small buckets, float32 and float64 parameters,
// gradients marked from two threads in a random order that differs per rank
// and per iteration: averaged gradients equal the mean computed directly and
// are bitwise identical on every rank; initial values come from rank 0.
BOOST_AUTO_TEST_CASE(averaged_gradients_in_random_ready_orders, *utf::timeout(120)) {
  require_all_zero(run_ranks(3, "avg", [](rank_env& env) {
    model<float> m(sizes);
    model<double> d({50, 70});
    for (auto& v : m.values)
      std::fill(v.begin(), v.end(), static_cast<float>(env.rank + 1));
    auto ps = m.parameters();
    for (auto& p : d.parameters())
      ps.push_back(p);
    dd::reducer_options o;
    o.bucket_cap_bytes = 2048;
    o.first_bucket_bytes = 512;
    o.rebuild_buckets = false;
    dd::reducer red(env.pg, ps, o);
    CHECK(red.layout().buckets.size() >= 4, "{} buckets", red.layout().buckets.size());
    for (auto& v : m.values)
      for (float x : v)
        CHECK(x == 1.0f, "values not broadcast from rank 0: {}", x);
    std::mt19937 rng(static_cast<unsigned>(env.rank * 7919 + 1));
    const std::size_t n = ps.size();
    for (int it = 0; it < 3; ++it) {
      red.prepare_for_backward();
      std::vector<std::size_t> order(n);
      for (std::size_t k = 0; k < n; ++k)
        order[k] = k;
      std::shuffle(order.begin(), order.end(), rng);
      std::atomic<std::size_t> next{0};
      auto worker = [&] {
        for (std::size_t k; (k = next.fetch_add(1)) < n;) {
          if (order[k] < m.values.size())
            fill_grad<float>(red, env.rank, it, order[k]);
          else
            fill_grad<double>(red, env.rank, it, order[k]);
          red.mark_grad_ready(order[k]);
        }
      };
      std::thread t1(worker), t2(worker);
      t1.join();
      t2.join();
      red.finalize_sync();
      for (std::size_t k = 0; k < n; ++k) {
        if (k < m.values.size())
          check_mean<float>(red, env.size, it, k);
        else
          check_mean<double>(red, env.size, it, k, 1e-12);
      }
      for (auto& g : m.grads)
        CHECK(same_on_all_ranks(*env.pg, g), "gradients differ between ranks");
      const auto& s = red.last_stats();
      CHECK(s.buckets.size() == red.layout().buckets.size(), "stats of {} buckets", s.buckets.size());
      CHECK(s.communication.count() > 0, "no communication time");
      CHECK(s.copied_bytes > 0, "copy mode copied nothing");
    }
    return 0;
  }));
}

// find_unused_parameters: rank 0 uses every parameter but 2; rank 1 uses
// neither 2 nor 3. Parameter 2 is globally unused (its gradient untouched),
// parameter 3 is averaged with rank 1's zero.
BOOST_AUTO_TEST_CASE(unused_parameters_on_some_ranks, *utf::timeout(120)) {
  require_all_zero(run_ranks(2, "unused", [](rank_env& env) {
    model<float> m({10, 20, 30, 40, 50});
    dd::reducer_options o;
    o.find_unused_parameters = true;
    o.bucket_cap_bytes = 100;
    o.first_bucket_bytes = 100;
    dd::reducer red(env.pg, m.parameters(), o);
    for (int it = 0; it < 2; ++it) {
      std::vector<std::size_t> used = env.rank == 0 ? std::vector<std::size_t>{0, 1, 3, 4}
                                                    : std::vector<std::size_t>{0, 1, 4};
      std::fill(m.grads[2].begin(), m.grads[2].end(), 42.0f); // must survive
      red.prepare_for_backward(used);
      for (auto k : used) {
        fill_grad<float>(red, env.rank, it, k);
        red.mark_grad_ready(k);
      }
      red.finalize_sync();
      CHECK(red.globally_unused() == std::vector<std::size_t>{2}, "globally unused: {}", red.globally_unused().size());
      CHECK(red.last_stats().globally_unused == 1, "stats");
      for (float x : m.grads[2])
        CHECK(x == 42.0f, "globally unused gradient overwritten: {}", x);
      for (std::size_t k : {0, 1, 4})
        check_mean<float>(red, env.size, it, k);
      for (std::size_t j = 0; j < m.grads[3].size(); ++j) {
        const double want = grad_value(0, it, 3, j) / 2;
        CHECK(m.grads[3][j] == static_cast<float>(want), "parameter 3: {} != {}", m.grads[3][j], want);
      }
    }
    // Without find_unused_parameters a used list is refused.
    return 0;
  }));
}

// no_sync over three iterations: two local ones accumulate (nothing is
// communicated), the third reduces the accumulated sum.
BOOST_AUTO_TEST_CASE(no_sync_accumulates_over_three_iterations, *utf::timeout(120)) {
  require_all_zero(run_ranks(2, "nosync", [](rank_env& env) {
    model<float> m(sizes);
    dd::reducer red(env.pg, m.parameters());
    const std::size_t n = sizes.size();
    auto step = [&](int it) {
      red.prepare_for_backward();
      for (std::size_t k = n; k-- > 0;) {
        for (std::size_t j = 0; j < sizes[k]; ++j)
          m.grads[k][j] += static_cast<float>(grad_value(env.rank, it, k, j)); // accumulate, as autograd does
        red.mark_grad_ready(k);
      }
      red.finalize_sync();
    };
    const auto seq0 = env.pg->sequence_number();
    {
      auto guard = red.no_sync();
      step(0);
      step(1);
      CHECK(!red.last_stats().synchronized, "no_sync iteration synchronized");
    }
    CHECK(env.pg->sequence_number() == seq0, "no_sync communicated ({} collectives)", env.pg->sequence_number() - seq0);
    step(2);
    CHECK(red.last_stats().synchronized, "third iteration not synchronized");
    for (std::size_t k = 0; k < n; ++k)
      for (std::size_t j = 0; j < sizes[k]; ++j) {
        double want = 0;
        for (int it = 0; it < 3; ++it)
          want += mean_grad(env.size, it, k, j);
        CHECK(std::abs(m.grads[k][j] - want) <= 1e-6 * std::max(1.0, std::abs(want)), "{} {}: {} != {}", k, j,
              m.grads[k][j], want);
      }
    return 0;
  }));
}

// Gradients become ready in registration order on rank 0 (the opposite of
// the initial layout's assumption) and in a random order on rank 1: after the
// first iteration every rank rebuilds the same buckets, from rank 0's order,
// and the next iterations are still right.
BOOST_AUTO_TEST_CASE(bucket_rebuild_from_rank_0s_order, *utf::timeout(120)) {
  require_all_zero(run_ranks(2, "rebuild", [](rank_env& env) {
    model<float> m(sizes);
    dd::reducer_options o;
    o.bucket_cap_bytes = 1600;
    o.first_bucket_bytes = 400;
    o.gradient_as_bucket_view = true;
    dd::reducer red(env.pg, m.parameters(false), o);
    const std::size_t n = sizes.size();
    CHECK(red.layout().buckets[0].parameters[0] == n - 1, "the first bucket starts with the last parameter");
    std::vector<std::size_t> forward(n);
    for (std::size_t k = 0; k < n; ++k)
      forward[k] = k;
    std::mt19937 rng(5);
    for (int it = 0; it < 3; ++it) {
      auto order = forward;
      if (env.rank == 1)
        std::shuffle(order.begin(), order.end(), rng);
      red.prepare_for_backward();
      for (auto k : order) {
        fill_grad<float>(red, env.rank, it, k);
        red.mark_grad_ready(k);
      }
      red.finalize_sync();
      CHECK(red.last_stats().rebuilt == (it == 0), "iteration {} rebuilt={}", it, red.last_stats().rebuilt);
      // The gradients moved with the rebuild (bucket views): still the means.
      for (std::size_t k = 0; k < n; ++k)
        check_mean<float>(red, env.size, it, k);
    }
    CHECK(red.rebuilt(), "not rebuilt");
    const auto want = dd::bucket_layout::compute(m.parameters(false), forward, o.first_bucket_bytes, o.bucket_cap_bytes);
    CHECK(red.layout().to_string() == want.to_string(), "layout\n{}is not rank 0's order's\n{}",
          red.layout().to_string(), want.to_string());
    auto bof = red.layout().bucket_of(n);
    std::vector<std::int64_t> b64(bof.begin(), bof.end());
    CHECK(same_on_all_ranks(*env.pg, b64), "layouts differ between ranks");
    return 0;
  }));
}

// Registration that differs between ranks: every rank gets a
// parameter_mismatch_error naming the parameter and the ranks.
BOOST_AUTO_TEST_CASE(mismatched_parameters_are_named, *utf::timeout(120)) {
  require_all_zero(run_ranks(3, "mismatch", [](rank_env& env) {
    auto s = sizes;
    if (env.rank == 2)
      s[3] = 63;
    model<float> m(s);
    try {
      dd::reducer red(env.pg, m.parameters());
      CHECK(false, "no mismatch detected");
    } catch (const dd::parameter_mismatch_error& e) {
      const std::string w = e.what();
      CHECK(e.parameter() == 3, "parameter {}", e.parameter());
      CHECK(w.find("parameter 3 ('p3')") != std::string::npos && w.find("rank 2 has float32 x 63") != std::string::npos &&
                w.find("rank 0 has float32 x 64") != std::string::npos,
            "message: {}", w);
    }
    // Different counts.
    auto s2 = sizes;
    if (env.rank == 1)
      s2.pop_back();
    model<float> m2(s2);
    try {
      dd::reducer red(env.pg, m2.parameters());
      CHECK(false, "no count mismatch detected");
    } catch (const dd::parameter_mismatch_error& e) {
      const std::string w = e.what();
      CHECK(w.find("rank 0 has 8, rank 1 has 7") != std::string::npos, "message: {}", w);
    }
    return 0;
  }));
}

// A gradient marked twice is refused at the second mark (usage_error naming
// it); the iteration still completes with the right values.
BOOST_AUTO_TEST_CASE(gradient_marked_twice, *utf::timeout(120)) {
  require_all_zero(run_ranks(2, "twice", [](rank_env& env) {
    model<float> m(sizes);
    dd::reducer red(env.pg, m.parameters());
    CHECK(corodist::test::require_throws<corodist::usage_error>([&] { red.mark_grad_ready(0); }, "mark before prepare")
                  .find("prepare_for_backward") != std::string::npos,
          "message");
    red.prepare_for_backward();
    for (std::size_t k = sizes.size(); k-- > 0;) {
      fill_grad<float>(red, env.rank, 0, k);
      red.mark_grad_ready(k);
    }
    auto w = corodist::test::require_throws<corodist::usage_error>([&] { red.mark_grad_ready(4); }, "second mark");
    CHECK(w.find("parameter 4 ('p4') marked ready twice") != std::string::npos, "message: {}", w);
    red.finalize_sync();
    for (std::size_t k = 0; k < sizes.size(); ++k)
      check_mean<float>(red, env.size, 0, k);
    return 0;
  }));
}

// finalize() with a gradient never marked: that rank's error names it, and
// the other rank fails because the group is aborted (collective_error), not
// at the deadline (collective_timeout_error).
BOOST_AUTO_TEST_CASE(missing_gradient_is_named, *utf::timeout(120)) {
  require_all_zero(run_ranks(
      2, "missing",
      [](rank_env& env) {
        model<float> m(sizes);
        dd::reducer_options o;
        o.bucket_cap_bytes = 1000;
        o.first_bucket_bytes = 1000;
        dd::reducer red(env.pg, m.parameters(), o);
        red.prepare_for_backward();
        for (std::size_t k = sizes.size(); k-- > 0;) {
          if (env.rank == 1 && k == 5)
            continue;
          red.mark_grad_ready(k);
        }
        try {
          red.finalize_sync();
          CHECK(false, "finalize succeeded");
        } catch (const dd::missing_gradients_error& e) {
          CHECK(env.rank == 1, "rank 0 got {}", e.what());
          CHECK(e.missing() == std::vector<std::size_t>{5}, "missing");
          CHECK(std::string(e.what()).find("parameter 5 ('p5')") != std::string::npos, "{}", e.what());
        } catch (const cc::collective_timeout_error& e) {
          CHECK(false, "rank {} waited for the deadline instead of failing at the abort: {}", env.rank, e.what());
        } catch (const cc::collective_error& e) {
          CHECK(env.rank == 0, "rank 1 got {}", e.what());
        }
        return 0;
      },
      30s));
}

// A rank that stops taking part: the others' finalize() fails with the
// group's collective_timeout_error at the reducer's deadline (not before it,
// and the reducer's, not the group's). A rank killed with SIGKILL: the others
// fail at once with collective_error.
BOOST_AUTO_TEST_CASE(silent_rank_surfaces_the_group_timeout, *utf::timeout(120)) {
  pipe_pair release;
  auto body = [&](rank_env& env) {
    model<float> m(sizes);
    dd::reducer_options o;
    o.timeout = 1s; // the deadline of each collective of an iteration (the group's: 20 s)
    dd::reducer red(env.pg, m.parameters(), o);
    if (env.rank == 2) {
      release.close_write();
      char c;
      (void)!::read(release.read_end(), &c, 1); // silent until the test ends
      return 0;
    }
    // Before the first mark: every collective of the iteration is issued after it.
    const auto t = std::chrono::steady_clock::now();
    red.prepare_for_backward();
    for (std::size_t k = sizes.size(); k-- > 0;)
      red.mark_grad_ready(k);
    try {
      red.finalize_sync();
    } catch (const cc::collective_timeout_error& e) {
      const auto waited = std::chrono::steady_clock::now() - t;
      CHECK(waited >= o.timeout.length(), "failed after {} ms, before the deadline",
            std::chrono::duration_cast<std::chrono::milliseconds>(waited).count());
      CHECK(std::string(e.what()).find("timed out after 1000 ms") != std::string::npos,
            "not the reducer's deadline: {}", e.what());
      std::fprintf(stderr, "rank %d as expected: %s\n", env.rank, e.what());
      return 0;
    } catch (const cc::collective_error& e) {
      // A peer's abort can reach this rank before its own deadline.
      std::fprintf(stderr, "rank %d as expected: %s\n", env.rank, e.what());
      return 0;
    }
    return 3;
  };
  std::unique_ptr<store_host> host;
  auto kids = start_ranks(host, 3, "silent", body, 20s);
  release.close_read();
  for (int r = 0; r < 2; ++r)
    BOOST_TEST(kids[static_cast<std::size_t>(r)]->wait_for(60s) == 0, "rank " << r);
  release.close_write();
  BOOST_TEST(kids[2]->wait_for(30s) == 0);
}

// Ranks reach construction at their own pace: a rank that comes later than
// the reducer's deadline does not fail the others' construction, whose
// collectives wait up to the group's timeout (20 s here); rank 0's values
// still reach it.
BOOST_AUTO_TEST_CASE(late_rank_at_construction_is_awaited, *utf::timeout(120)) {
  require_all_zero(run_ranks(2, "late", [](rank_env& env) {
    model<float> m(sizes);
    for (auto& v : m.values)
      std::fill(v.begin(), v.end(), static_cast<float>(env.rank + 1));
    dd::reducer_options o;
    o.timeout = 200ms;
    // The behaviour under test, not synchronisation: rank 1 arrives three
    // deadlines late (a rank still loading its model).
    if (env.rank == 1)
      std::this_thread::sleep_for(3 * o.timeout.length());
    dd::reducer red(env.pg, m.parameters(), o);
    for (auto& v : m.values)
      for (float x : v)
        CHECK(x == 1.0f, "values not broadcast from rank 0: {}", x);
    return 0;
  }));
}

BOOST_AUTO_TEST_CASE(killed_rank_fails_finalize, *utf::timeout(120)) {
  pipe_pair started;
  auto body = [&](rank_env& env) {
    model<float> m(sizes);
    dd::reducer red(env.pg, m.parameters());
    for (int it = 0; it < 100000; ++it) {
      red.prepare_for_backward();
      for (std::size_t k = sizes.size(); k-- > 0;)
        red.mark_grad_ready(k);
      try {
        red.finalize_sync();
      } catch (const cc::collective_timeout_error& e) {
        std::fprintf(stderr, "rank %d waited for the deadline instead of failing at the death: %s\n", env.rank,
                     e.what());
        return 6;
      } catch (const cc::collective_error& e) {
        std::fprintf(stderr, "rank %d as expected: %s\n", env.rank, e.what());
        return env.rank == 2 ? 5 : 0;
      }
      if (env.rank == 2 && it == 3) {
        char c = 'x';
        (void)!::write(started.write_end(), &c, 1);
      }
    }
    return 4;
  };
  std::unique_ptr<store_host> host;
  auto kids = start_ranks(host, 3, "killed", body, 30s);
  started.close_write();
  BOOST_REQUIRE(wait_readable(started.read_end(), 60s));
  ::kill(kids[2]->pid(), SIGKILL);
  BOOST_TEST(kids[2]->wait() == 128 + SIGKILL);
  for (int r = 0; r < 2; ++r)
    BOOST_TEST(kids[static_cast<std::size_t>(r)]->wait_for(60s) == 0, "rank " << r);
}

// Three ranks; rank 2 dies (SIGKILL) in the middle of the second step, with
// some buckets launched. The survivors' finalize throws rank_lost_error
// naming rank 2; they form a group of 2 under a new prefix, hand it to the
// reducer (set_group, between iterations: no collective), and the next
// step's gradients are the mean over 2, exactly (multiples of 1/8).
BOOST_AUTO_TEST_CASE(a_lost_rank_then_set_group_averages_over_the_survivors, *utf::timeout(120)) {
  auto body = [](rank_env& env) {
    // float32 parameters (averaged by the group: reduce_op::avg) and
    // float16 ones (divided by the reducer's world size as they enter their
    // bucket, then summed).
    model<float> m(sizes);
    model<cc::float16> h({100, 37});
    auto ps = m.parameters();
    for (auto& p : h.parameters())
      ps.push_back(p);
    dd::reducer_options o;
    o.bucket_cap_bytes = 2048;
    o.first_bucket_bytes = 512;
    dd::reducer red(env.pg, ps, o);
    const std::size_t n = ps.size();
    const std::size_t nf = sizes.size();
    auto fill = [&](int rank, int it, std::size_t k) {
      if (k < nf)
        fill_grad<float>(red, rank, it, k);
      else
        fill_grad<cc::float16>(red, rank, it, k);
    };
    auto check = [&](int size, int it, double tol16, double tol) {
      for (std::size_t k = 0; k < n; ++k)
        if (k < nf)
          check_mean<float>(red, size, it, k, tol);
        else
          check_mean<cc::float16>(red, size, it, k, tol16);
    };
    auto step = [&](int it, int rank) {
      red.prepare_for_backward();
      for (std::size_t k = n; k-- > 0;) {
        fill(rank, it, k);
        red.mark_grad_ready(k);
      }
      red.finalize_sync();
    };
    step(0, env.rank);
    check(3, 0, 2e-3, 1e-6); // (thirds are inexact in float16)
    if (env.rank == 2) { // dies with half of its gradients marked: some buckets are in flight
      red.prepare_for_backward();
      for (std::size_t k = n; k-- > n / 2;) {
        fill(2, 1, k);
        red.mark_grad_ready(k);
      }
      ::raise(SIGKILL);
    }
    int lost = -1;
    try {
      step(1, env.rank);
      std::fprintf(stderr, "rank %d: the step with a dead rank completed\n", env.rank);
      return 3;
    } catch (const cc::rank_lost_error& e) {
      std::fprintf(stderr, "rank %d as expected: %s\n", env.rank, e.what());
      lost = e.rank();
    }
    CHECK(lost == 2, "rank_lost_error names rank {}", lost);
    // The reducer is not stuck: another iteration starts (on the aborted
    // group, so it fails at once, as rank_lost_error again); set_group is
    // refused inside it.
    red.prepare_for_backward();
    CHECK(corodist::test::require_throws<corodist::usage_error>([&] { red.set_group(env.pg); },
                                                                "set_group inside an iteration")
                  .find("inside an iteration") != std::string::npos,
          "message");
    for (std::size_t k = n; k-- > 0;)
      red.mark_grad_ready(k);
    CHECK(corodist::test::require_throws<cc::rank_lost_error>([&] { red.finalize_sync(); }, "a step on the aborted group")
                  .find("rank 2 lost") != std::string::npos,
          "message");
    auto survivors = cc::gloo_group::create_sync(env.store, env.rank, 2,
                                                 corodist::test::gloo_test_options("setgroup/survivors", 30s));
    red.set_group(survivors);
    CHECK(red.group().size() == 2, "group size {}", red.group().size());
    for (int it = 2; it < 4; ++it) {
      step(it, env.rank);
      check(2, it, 0.0, 0.0); // halves of multiples of 1/8: exact in both types
    }
    return 0;
  };
  std::unique_ptr<store_host> host;
  auto kids = start_ranks(host, 3, "setgroup", body, 30s);
  BOOST_TEST(kids[2]->wait_for(60s) == 128 + SIGKILL);
  for (int r = 0; r < 2; ++r)
    BOOST_TEST(kids[static_cast<std::size_t>(r)]->wait_for(60s) == 0, "rank " << r);
}

// A reducer destroyed in the middle of an iteration (buckets in flight,
// others never complete) returns promptly: the group is aborted, and the
// buckets' collectives end before the bucket memory goes. The group's
// deadline is beyond the test's patience (run_ranks waits 90 s for a rank):
// a destructor that waited for it instead would fail the test.
BOOST_AUTO_TEST_CASE(destroyed_mid_iteration, *utf::timeout(120)) {
  require_all_zero(run_ranks(2, "destroy", [](rank_env& env) {
    model<float> m(sizes);
    {
      dd::reducer_options o;
      o.bucket_cap_bytes = 1000;
      o.first_bucket_bytes = 1000;
      dd::reducer red(env.pg, m.parameters(), o);
      red.prepare_for_backward();
      for (std::size_t k = sizes.size(); k-- > 4;)
        red.mark_grad_ready(k);
    }
    CHECK(env.pg->aborted(), "the group was not aborted");
    return 0;
  }, 10min));
}

// gradient_as_bucket_view both ways: the same gradients give the same
// averages; with views the gradients live in bucket memory and nothing is copied.
BOOST_AUTO_TEST_CASE(gradient_as_bucket_view_both_ways, *utf::timeout(120)) {
  require_all_zero(run_ranks(2, "views", [](rank_env& env) {
    for (bool view : {false, true}) {
      model<float> m(sizes);
      dd::reducer_options o;
      o.gradient_as_bucket_view = view;
      o.bucket_cap_bytes = 2000;
      o.first_bucket_bytes = 500;
      dd::reducer red(env.pg, m.parameters(!view), o);
      for (int it = 0; it < 2; ++it) {
        red.prepare_for_backward();
        for (std::size_t k = sizes.size(); k-- > 0;) {
          fill_grad<float>(red, env.rank, it, k);
          red.mark_grad_ready(k);
        }
        red.finalize_sync();
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          check_mean<float>(red, env.size, it, k);
          const bool in_registered = red.gradient(k).data() == m.grads[k].data();
          CHECK(in_registered == !view, "view={}: gradient {} lives {}", view, k,
                in_registered ? "in the registered memory" : "elsewhere");
        }
        CHECK((red.last_stats().copied_bytes == 0) == view, "view={}: copied {} B", view,
              red.last_stats().copied_bytes);
      }
    }
    return 0;
  }));
}

// The fp16 compression hook: averages within float16 precision, and really
// compressed (some results differ from the float32 mean).
BOOST_AUTO_TEST_CASE(fp16_hook_within_fp16_precision, *utf::timeout(120)) {
  require_all_zero(run_ranks(2, "fp16", [](rank_env& env) {
    model<float> m({1000, 3000});
    dd::reducer red(env.pg, m.parameters());
    red.register_comm_hook(dd::hooks::fp16_compress());
    auto value = [](int r, std::size_t k, std::size_t j) {
      return static_cast<float>(std::sin(0.37 * static_cast<double>(j) + static_cast<double>(k) + r * 1.3));
    };
    red.prepare_for_backward();
    for (std::size_t k = 2; k-- > 0;) {
      for (std::size_t j = 0; j < m.grads[k].size(); ++j)
        m.grads[k][j] = value(env.rank, k, j);
      red.mark_grad_ready(k);
    }
    red.finalize_sync();
    std::size_t inexact = 0;
    for (std::size_t k = 0; k < 2; ++k)
      for (std::size_t j = 0; j < m.grads[k].size(); ++j) {
        const float want = (value(0, k, j) + value(1, k, j)) / 2;
        const float got = m.grads[k][j];
        CHECK(std::abs(got - want) <= 2e-3f * std::max(1.0f, std::abs(want)), "{} {}: {} != {}", k, j, got, want);
        inexact += got != want;
      }
    CHECK(inexact > 100, "only {} results differ from the float32 mean: not compressed?", inexact);
    CHECK(corodist::test::require_throws<corodist::usage_error>(
              [&] { red.register_comm_hook(dd::hooks::allreduce()); }, "late hook")
                  .find("after the first iteration") != std::string::npos,
          "message");
    return 0;
  }));
}

// A user hook (a coroutine): sees the buckets in index order with this
// rank's raw gradients, and its result is what finalize leaves.
BOOST_AUTO_TEST_CASE(user_comm_hook, *utf::timeout(120)) {
  require_all_zero(run_ranks(2, "hook", [](rank_env& env) {
    model<float> m(sizes);
    dd::reducer_options o;
    o.bucket_cap_bytes = 2000;
    o.first_bucket_bytes = 500;
    dd::reducer red(env.pg, m.parameters(), o);
    std::vector<std::size_t> seen;
    red.register_comm_hook([&](dd::grad_bucket& b) -> asio::awaitable<void> {
      seen.push_back(b.index());
      auto buf = b.buffer();
      co_await b.group().allreduce(buf, cc::reduce_op::max, b.call()); // the max, not the mean
    });
    std::vector<std::size_t> want(red.layout().buckets.size()); // (the layout is rebuilt after this iteration)
    for (std::size_t b = 0; b < want.size(); ++b)
      want[b] = b;
    red.prepare_for_backward();
    for (std::size_t k = 0; k < sizes.size(); ++k) { // against the layout's order
      fill_grad<float>(red, env.rank, 0, k);
      red.mark_grad_ready(k);
    }
    red.finalize_sync();
    std::string saw;
    for (auto b : seen)
      saw += fmt::format(" {}", b);
    CHECK(seen == want, "hook saw buckets{} of {}", saw, want.size());
    for (std::size_t k = 0; k < sizes.size(); ++k)
      for (std::size_t j = 0; j < sizes[k]; ++j) {
        const float mx = static_cast<float>(std::max(grad_value(0, 0, k, j), grad_value(1, 0, k, j)));
        CHECK(m.grads[k][j] == mx, "{} {}: {} != {}", k, j, m.grads[k][j], mx);
      }
    return 0;
  }));
}

// The coroutine forms (create, co_await finalize) on a loop of the caller's,
// and registered buffers: rank 0's at construction and at every iteration.
BOOST_AUTO_TEST_CASE(coroutine_forms_and_buffers, *utf::timeout(120)) {
  require_all_zero(run_ranks(2, "coro", [](rank_env& env) {
    event_loop loop;
    loop.start();
    model<float> m(sizes);
    std::vector<double> running(16, static_cast<double>(env.rank + 5)); // a "running mean" buffer
    return corodist::run_blocking(loop.get_executor(), [&]() -> asio::awaitable<int> {
      dd::reducer_options o;
      o.buffers = {cc::tensor_view(running)};
      auto red = co_await dd::reducer::create(loop.get_executor(), env.pg, m.parameters(), o);
      for (double x : running)
        CHECK(x == 5.0, "buffer not rank 0's at construction: {}", x);
      for (int it = 0; it < 3; ++it) {
        std::fill(running.begin(), running.end(), static_cast<double>(env.rank * 100 + it)); // the forward's update
        red->prepare_for_backward();
        for (std::size_t k = sizes.size(); k-- > 0;) {
          fill_grad<float>(*red, env.rank, it, k);
          red->mark_grad_ready(k);
        }
        co_await red->finalize();
        for (double x : running)
          CHECK(x == static_cast<double>(it), "iteration {}: buffer {} is not rank 0's", it, x);
        for (std::size_t k = 0; k < sizes.size(); ++k)
          check_mean<float>(*red, env.size, it, k);
      }
      co_return 0;
    }(), "test");
  }));
}

// Bad input: clear errors before anything is communicated.
BOOST_AUTO_TEST_CASE(bad_registration_is_refused, *utf::timeout(60)) {
  corodist::test::thread_ranks ranks;
  auto errors = ranks.run(1, [&](int r) {
    auto pg = ranks.group(r, 1, corodist::test::gloo_test_options("bad"));
    std::vector<float> v(4), g(3);
    std::vector<std::int32_t> iv(4), ig(4);
    auto msg = corodist::test::require_throws<corodist::usage_error>(
        [&] { dd::reducer red(pg, {dd::parameter(std::span<float>(v), std::span<float>(g), "w")}); }, "sizes");
    RANK_REQUIRE(msg.find("'w'") != std::string::npos);
    msg = corodist::test::require_throws<corodist::usage_error>(
        [&] { dd::reducer red(pg, {dd::parameter(std::span<std::int32_t>(iv), std::span<std::int32_t>(ig))}); },
        "int dtype");
    RANK_REQUIRE(msg.find("floating") != std::string::npos);
    msg = corodist::test::require_throws<corodist::usage_error>([&] { dd::reducer red(pg, {}); }, "empty");
    RANK_REQUIRE(msg.find("no parameters") != std::string::npos);
    msg = corodist::test::require_throws<corodist::usage_error>(
        [&] {
          std::vector<float> gg(4);
          dd::reducer red(pg, {dd::parameter(std::span<float>(v), std::span<float>(gg))});
          red.prepare_for_backward(std::vector<std::size_t>{0});
        },
        "used list without find_unused");
    RANK_REQUIRE(msg.find("find_unused_parameters") != std::string::npos);
  });
  BOOST_TEST(errors[0] == "");
}

// The reducer's flight recorders: an entry per bucket and iteration, started
// once every gradient of the bucket is marked and completed with its
// allreduce (seq = the bucket, its parameter count and bytes), and every
// gradient mark as an instant in the marks' own recorder.
BOOST_AUTO_TEST_CASE(buckets_and_marks_are_recorded, *utf::timeout(120)) {
  require_all_zero(run_ranks(2, "recorded", [](rank_env& env) {
    model<float> m(sizes);
    auto ps = m.parameters();
    dd::reducer_options o;
    o.bucket_cap_bytes = 2048;
    o.first_bucket_bytes = 512;
    o.rebuild_buckets = false;
    dd::reducer red(env.pg, ps, o);
    const auto& layout = red.layout();
    const std::size_t nb = layout.buckets.size(), n = ps.size();
    CHECK(nb >= 3, "{} buckets", nb);
    const int iterations = 2;
    for (int it = 0; it < iterations; ++it) {
      red.prepare_for_backward();
      for (std::size_t k = n; k-- > 0;) {
        fill_grad<float>(red, env.rank, it, k);
        red.mark_grad_ready(k);
      }
      red.finalize_sync();
    }
    // This reducer's recorders (the only live "ddp" ones in this process).
    const auto doc = nlohmann::json::parse(corodist::dump_flight_recorders());
    std::vector<nlohmann::json> buckets, marks;
    for (const auto& r : doc.at("recorders")) {
      if (r.at("layer") != "ddp")
        continue;
      const auto name = r.at("name").get<std::string>();
      (name.ends_with("/marks") ? marks : buckets) = r.at("entries").get<std::vector<nlohmann::json>>();
      CHECK(name.starts_with("reducer "), "recorder {}", name);
    }
    CHECK(buckets.size() == nb * iterations, "{} bucket entries for {} buckets", buckets.size(), nb);
    CHECK(marks.size() == n * iterations, "{} marks for {} parameters", marks.size(), n);
    for (std::size_t k = 0; k < marks.size(); ++k) {
      CHECK(marks[k].at("op") == "mark", "{}", marks[k].dump());
      CHECK(marks[k].at("detail") == std::to_string(n - 1 - k % n), "{}", marks[k].dump()); // marked in reverse
    }
    for (std::size_t e = 0; e < buckets.size(); ++e) {
      const auto& x = buckets[e];
      const auto b = x.at("seq").get<std::size_t>();
      CHECK(b < nb, "{}", x.dump());
      CHECK(x.at("op") == "bucket" && x.at("state") == "completed", "{}", x.dump());
      CHECK(x.at("detail") == fmt::format("bucket {} ({} params)", b, layout.buckets[b].parameters.size()), "{}",
            x.dump());
      CHECK(x.at("bytes").get<std::size_t>() == layout.buckets[b].bytes(), "{}", x.dump());
      // Ready once its last gradient was marked (this iteration's marks).
      const std::size_t it = e / nb;
      std::int64_t last_mark = 0;
      for (auto p : layout.buckets[b].parameters)
        last_mark = std::max(last_mark, marks[it * n + (n - 1 - p)].at("started_ns").get<std::int64_t>());
      CHECK(x.at("started_ns").get<std::int64_t>() >= last_mark, "bucket {} started before its last mark", b);
      CHECK(x.at("ended_ns").get<std::int64_t>() >= x.at("started_ns").get<std::int64_t>(), "{}", x.dump());
    }
    return 0;
  }));
}

#ifdef CORODIST_DDP_TRAIN_PATH
// The training example (a two-layer perceptron with a hand-written backward)
// on 4 ranks under corodist-run for 50 steps ends at the parameters of
// single-process full-batch training on the same data, within 1e-6 relative
// (each rank checks, and exits 1 otherwise).
BOOST_AUTO_TEST_CASE(four_ranks_train_like_one_process, *utf::timeout(120)) {
  corodist::test::program job({CORODIST_RUN_PATH, "--nproc", "4", "--", CORODIST_DDP_TRAIN_PATH, "50"});
  const int status = job.wait(100s);
  BOOST_TEST_MESSAGE(job.output());
  BOOST_TEST(status == 0, job.output());
  int matched = 0;
  for (std::size_t at = 0; (at = job.output().find("max_rel_diff", at)) != std::string::npos; ++at)
    ++matched;
  BOOST_TEST(matched == 4, job.output());
}
#endif

BOOST_AUTO_TEST_SUITE_END()
