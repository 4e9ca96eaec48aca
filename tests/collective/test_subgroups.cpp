// Subgroups of a gloo_group with ranks as threads of this process: split by
// colors and keys, new_group over a subset (non-members get null), bad
// arguments, and device meshes (2x2, 4x2) with their groups and coordinates;
// with ranks as processes: a killed rank fails its subgroup, not its sibling.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/device_mesh.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/collective/new_group.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>

#include <corodist/collective/errors.hpp>

#include "collective/gloo_fixtures.hpp"
#include "store/store_fixtures.hpp"
#include "support/child_process.hpp"

#include <poll.h>

#include <csignal>
#include <cstdio>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

namespace utf = boost::unit_test;
namespace cc = corodist::collective;
using corodist::test::gloo_test_options;
using corodist::test::require_all_ok;
using corodist::test::require_throws;
using corodist::test::thread_ranks;

namespace {


// The sum over `g` of each rank's `value` (an allreduce of one int64).
std::int64_t sum_over(cc::process_group& g, std::int64_t value) {
  std::vector<std::int64_t> v{value};
  g.allreduce(cc::tensor_view(v)).get();
  return v[0];
}

bool wait_readable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

template <typename T>
T blocking(thread_ranks& job, asio::awaitable<T> op) {
  return corodist::run_blocking(job.loop.get_executor(), std::move(op), "test");
}

} // namespace

BOOST_AUTO_TEST_SUITE(subgroups, *utf::precondition(corodist::test::gloo_built))

// Six ranks: evens form color 0 (equal keys: ranked by parent rank), 1 and 3
// color 1 with keys that reverse them, 5 no color. Each subgroup's sums are
// its own; the parent and the subgroups run independently afterwards, and
// aborting one subgroup leaves the parent and the other subgroup working.
BOOST_AUTO_TEST_CASE(split_by_colors_and_keys, *utf::timeout(120)) {
  thread_ranks job;
  corodist::test::countdown aborted(2); // color 1's ranks have aborted their subgroup
  require_all_ok(job.run(6, [&](int r) {
    auto parent = job.group(r, 6);
    const int color = r == 5 ? cc::no_color : r % 2;
    const int key = r % 2 == 0 ? 0 : -r;
    auto sub = blocking(job, parent->split(color, key));
    if (r == 5) {
      RANK_REQUIRE(sub == nullptr);
    } else {
      RANK_REQUIRE(sub != nullptr);
      RANK_REQUIRE(sub->backend() == "gloo");
      RANK_REQUIRE(sub->sequence_number() == 0);
      if (color == 0) {
        RANK_REQUIRE(sub->size() == 3);
        RANK_REQUIRE(sub->rank() == r / 2);
        RANK_REQUIRE(sum_over(*sub, r + 1) == 1 + 3 + 5);
      } else {
        RANK_REQUIRE(sub->size() == 2);
        RANK_REQUIRE(sub->rank() == (r == 3 ? 0 : 1));
        RANK_REQUIRE(sum_over(*sub, r + 1) == 2 + 4);
        // Rank 0 of color 1 is parent rank 3: its buffer reaches parent rank 1.
        std::vector<std::int64_t> b{r == 3 ? 42 : 0};
        sub->broadcast(cc::tensor_view(b), 0).get();
        RANK_REQUIRE(b[0] == 42);
      }
      auto prefix = std::static_pointer_cast<cc::gloo_group>(sub)->prefix();
      RANK_REQUIRE(prefix == "test/pg/split0/" + std::to_string(color));
    }
    // The parent's collectives go on, numbered on their own (the split's allgather was #0).
    RANK_REQUIRE(parent->sequence_number() == 1);
    RANK_REQUIRE(sum_over(*parent, r) == 15);
    if (color == 1) {
      sub->abort("test");
      RANK_REQUIRE(sub->aborted());
      aborted.arrive();
    }
    RANK_REQUIRE(aborted.wait_for(std::chrono::seconds(30)));
    RANK_REQUIRE(!parent->aborted());
    RANK_REQUIRE(sum_over(*parent, 1) == 6);
    if (color == 0)
      RANK_REQUIRE(sum_over(*sub, 10) == 30);
    // A second split of the same parent counts on (split1), with a name: under it.
    cc::split_options o;
    o.name = "halves";
    auto half = blocking(job, parent->split(r / 3, r, o));
    RANK_REQUIRE(half && half->size() == 3 && half->rank() == r % 3);
    RANK_REQUIRE(std::static_pointer_cast<cc::gloo_group>(half)->prefix() ==
                 "test/pg/halves/" + std::to_string(r / 3));
    RANK_REQUIRE(sum_over(*half, r) == (r < 3 ? 0 + 1 + 2 : 3 + 4 + 5));
    auto third = blocking(job, parent->split(0, 0));
    RANK_REQUIRE(std::static_pointer_cast<cc::gloo_group>(third)->prefix() == "test/pg/split2/0");
    RANK_REQUIRE(third->size() == 6 && third->rank() == r);
  }));
}

// new_group over parent ranks {3, 1} of 4 (unsorted): 1 becomes rank 0, 3
// rank 1; 0 and 2 get null. Bad rank lists throw on every rank before any
// communication, and the parent stays usable. A group's timeout is the
// split's, or the parent's; aborting the parent leaves a subgroup working.
BOOST_AUTO_TEST_CASE(new_group_over_a_subset, *utf::timeout(120)) {
  thread_ranks job;
  require_all_ok(job.run(4, [&](int r) {
    std::shared_ptr<cc::process_group> parent = job.group(r, 4);
    auto g = blocking(job, cc::new_group(parent, {3, 1}));
    if (r == 0 || r == 2) {
      RANK_REQUIRE(g == nullptr);
    } else {
      RANK_REQUIRE(g && g->size() == 2 && g->rank() == r / 2);
      RANK_REQUIRE(sum_over(*g, 100 * r) == 400);
    }
    RANK_REQUIRE(sum_over(*parent, r) == 6);
    for (const std::vector<int>& bad : {std::vector<int>{}, std::vector<int>{0, 4}, std::vector<int>{-1},
                                        std::vector<int>{2, 0, 2}}) {
      auto text = require_throws<corodist::usage_error>([&] { blocking(job, cc::new_group(parent, bad)); },
                                                        "new_group with a bad rank list");
      RANK_REQUIRE(text.find("new_group") != std::string::npos);
    }
    require_throws<corodist::usage_error>([&] { blocking(job, cc::new_group(nullptr, {0})); }, "null parent");
    require_throws<corodist::usage_error>([&] { blocking(job, parent->split(-2, 0)); }, "negative color");
    RANK_REQUIRE(parent->sequence_number() == 2);
    // Every rank, in a new group of all ranks: a copy of the parent, with the
    // split's own timeout.
    cc::split_options o;
    o.timeout = std::chrono::seconds(7);
    auto all = blocking(job, cc::new_group(parent, {0, 1, 2, 3}, o));
    RANK_REQUIRE(all && all->rank() == r && all->size() == 4);
    RANK_REQUIRE(all->timeout().length() == std::chrono::seconds(7));
    RANK_REQUIRE(g == nullptr || g->timeout().length() == parent->timeout().length()); // inherited
    RANK_REQUIRE(sum_over(*all, r + 1) == 10);
    // The parent's abort leaves its subgroups working.
    parent->abort("test");
    RANK_REQUIRE(!all->aborted());
    RANK_REQUIRE(sum_over(*all, 1) == 4);
  }));
}

// new_group straight from the job's store (no parent): members of {2, 0}
// form a group of 2 under "<prefix>/0,2"; the others get null without any
// communication; bad lists are refused.
BOOST_AUTO_TEST_CASE(new_group_from_the_store, *utf::timeout(120)) {
  thread_ranks job;
  require_all_ok(job.run(3, [&](int r) {
    auto g = blocking(job, cc::new_group(job.store, r, 3, {2, 0}, gloo_test_options("from_store")));
    if (r == 1) {
      RANK_REQUIRE(g == nullptr);
    } else {
      RANK_REQUIRE(g && g->size() == 2 && g->rank() == r / 2);
      RANK_REQUIRE(std::dynamic_pointer_cast<cc::gloo_group>(g)->prefix() == "from_store/0,2");
      RANK_REQUIRE(sum_over(*g, r + 1) == 4);
    }
    require_throws<corodist::usage_error>(
        [&] { blocking(job, cc::new_group(job.store, r, 3, {0, 3}, gloo_test_options("bad"))); }, "rank 3");
    require_throws<corodist::usage_error>(
        [&] { blocking(job, cc::new_group(job.store, 3, 3, {0}, gloo_test_options("bad"))); }, "rank of 3");
  }));
}

// A 2x2 and a 4x2 mesh: coordinates row-major, each group's rank its
// coordinate, sums along each dimension over the right ranks.
BOOST_AUTO_TEST_CASE(device_mesh_groups_and_coordinates, *utf::timeout(180)) {
  for (auto [rows, cols] : {std::pair{2, 2}, std::pair{4, 2}}) {
    thread_ranks job;
    const int n = rows * cols;
    require_all_ok(job.run(n, [&, rows = rows, cols = cols](int r) {
      std::shared_ptr<cc::process_group> parent = job.group(r, n);
      std::vector<cc::mesh_dim> shape{{"dp", rows}, {"tp", cols}};
      auto mesh = blocking(job, cc::device_mesh::create(parent, shape));
      RANK_REQUIRE(mesh.ndim() == 2 && mesh.dims()[0].name == "dp" && mesh.dims()[1].size == cols);
      RANK_REQUIRE(mesh.size("dp") == rows && mesh.size("tp") == cols);
      RANK_REQUIRE(mesh.coordinate("dp") == r / cols && mesh.coordinate("tp") == r % cols);
      RANK_REQUIRE(mesh.rank_of(mesh.coordinates()) == r);
      RANK_REQUIRE(mesh.rank_of({rows - 1, cols - 1}) == n - 1);
      RANK_REQUIRE((mesh.coordinates_of(cols) == std::vector<int>{1, 0}));
      auto& tp = *mesh.group("tp");
      auto& dp = *mesh.group("dp");
      RANK_REQUIRE(tp.size() == cols && tp.rank() == mesh.coordinate("tp"));
      RANK_REQUIRE(dp.size() == rows && dp.rank() == mesh.coordinate("dp"));
      // tp: the ranks of this row; dp: the ranks of this column.
      const int row = r / cols, col = r % cols;
      std::int64_t row_sum = 0, col_sum = 0;
      for (int c = 0; c < cols; ++c)
        row_sum += row * cols + c;
      for (int w = 0; w < rows; ++w)
        col_sum += w * cols + col;
      RANK_REQUIRE(sum_over(tp, r) == row_sum);
      RANK_REQUIRE(sum_over(dp, r) == col_sum);
      require_throws<corodist::usage_error>([&] { (void)mesh.group("pp"); }, "unknown dimension");
      require_throws<corodist::usage_error>([&] { (void)mesh.rank_of({rows, 0}); }, "coordinate out of range");
      std::vector<cc::mesh_dim> wrong{{"dp", rows + 1}, {"tp", cols}};
      auto text = require_throws<corodist::usage_error>([&] { blocking(job, cc::device_mesh::create(parent, wrong)); },
                                                        "a shape that does not hold the ranks");
      RANK_REQUIRE(text.find("does not hold") != std::string::npos);
      std::vector<cc::mesh_dim> twice{{"x", rows}, {"x", cols}};
      require_throws<corodist::usage_error>([&] { blocking(job, cc::device_mesh::create(parent, twice)); },
                                            "a name used twice");
      // A three-dimensional mesh over the same ranks, named.
      cc::split_options o;
      o.name = "mesh3";
      std::vector<cc::mesh_dim> cube{{"a", rows / 2}, {"b", 2}, {"c", cols}};
      auto m3 = blocking(job, cc::device_mesh::create(parent, cube, o));
      RANK_REQUIRE(m3.group("b")->size() == 2 && m3.group("b")->rank() == (r / cols) % 2);
      RANK_REQUIRE(sum_over(*m3.group("b"), 1) == 2);
      RANK_REQUIRE(std::static_pointer_cast<cc::gloo_group>(m3.group("c"))->prefix().rfind("test/pg/mesh3/c/", 0) == 0);
    }));
  }
}

// Four rank processes split into {0, 1} and {2, 3}; rank 3 is killed with
// SIGKILL. Rank 2's allreduce in its subgroup fails with rank_lost_error
// naming subgroup rank 1; once rank 3's member key of the parent is gone,
// ranks 0 and 1 still allreduce in their subgroup (not aborted), while the
// parent's next collective fails with rank_lost_error naming rank 3.
BOOST_AUTO_TEST_CASE(a_killed_rank_fails_its_subgroup_and_not_its_sibling, *utf::timeout(120)) {
  corodist::test::tcp_impl host;
  const auto port = host.port();
  using corodist::test::child_process;
  enum : int { as_expected = 0, wrong_error = 2, wrong_rank = 3, never_failed = 4, failed = 5, wrong_sum = 6 };
  auto rank_main = [port](int r, int ready_fd) -> int {
    corodist::event_loop loop;
    loop.start();
    auto store = corodist::test::connect_test_store(loop, port);
    std::shared_ptr<cc::process_group> parent =
        cc::gloo_group::create_sync(store, r, 4, gloo_test_options("killed", std::chrono::seconds(30)));
    auto gone = corodist::run_blocking(loop.get_executor(), store->watch_key("killed/member/3"), "watch_key");
    auto sub = corodist::run_blocking(loop.get_executor(), parent->split(r / 2, r), "split");
    std::vector<std::int64_t> v{r};
    sub->allreduce(cc::tensor_view(v)).get();
    if (v[0] != (r < 2 ? 1 : 5))
      return wrong_sum;
    if (r == 3) {
      char c = 'x';
      (void)!::write(ready_fd, &c, 1);
      for (;;)
        ::pause(); // until killed
    }
    try {
      if (r == 2) { // in the subgroup of the killed rank
        sub->allreduce(cc::tensor_view(v)).get();
        return never_failed;
      }
      const auto e = corodist::run_blocking(loop.get_executor(), gone.next(std::chrono::seconds(30)), "member key");
      if (e.type != corodist::store::watch_event::kind::deleted)
        return failed;
      v[0] = r;
      sub->allreduce(cc::tensor_view(v)).get(); // the sibling subgroup goes on
      if (v[0] != 1 || sub->aborted())
        return wrong_sum;
      parent->allreduce(cc::tensor_view(v)).get();
      return never_failed;
    } catch (const cc::rank_lost_error& e) {
      std::fprintf(stderr, "rank %d as expected: %s\n", r, e.what());
      return e.rank() == (r == 2 ? 1 : 3) ? as_expected : wrong_rank;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      return wrong_error;
    }
  };
  corodist::test::pipe_pair ready;
  std::vector<std::unique_ptr<child_process>> kids;
  for (int r = 0; r < 3; ++r)
    kids.push_back(std::make_unique<child_process>([&, r] { return rank_main(r, -1); }));
  child_process victim([&] {
    ready.close_read();
    return rank_main(3, ready.write_end());
  });
  ready.close_write();
  BOOST_REQUIRE(wait_readable(ready.read_end(), std::chrono::seconds(60)));
  ::kill(victim.pid(), SIGKILL);
  BOOST_TEST(victim.wait() == 128 + SIGKILL);
  for (int r = 0; r < 3; ++r) {
    const int code = kids[static_cast<std::size_t>(r)]->wait_for(std::chrono::seconds(60));
    BOOST_TEST(code == static_cast<int>(as_expected), "rank " << r << " exited with " << code);
  }
}

BOOST_AUTO_TEST_SUITE_END()
