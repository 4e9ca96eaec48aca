// A corodist Gloo rank in a process group with PyTorch 1.13 ranks (Debian's
// python3-torch): one C++ rank among PyTorch ranks on PyTorch's own TCPStore
// master, and rank 0 in C++ hosting the store for PyTorch ranks. Both sides
// run the same collectives (tests/collective/pytorch/torch_gloo_job.py) and
// check the results: the classic collectives, then send/recv, all_to_all_single
// (even and uneven), gather, scatter and reduce.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/gloo_group.hpp>
#include <corodist/collective/new_group.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>
#include <corodist/store/torch_store.hpp>

#include "collective/gloo_fixtures.hpp"
#include "support/program.hpp"

#include <algorithm>
#include <cstdlib>
#include <numeric>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cc = corodist::collective;
namespace cs = corodist::store;
using corodist::event_loop;
using corodist::test::program;

namespace {

std::string python() {
  const char* p = std::getenv("CORODIST_TEST_PYTHON");
  return p ? p : "/usr/bin/python3";
}

const std::string job_script = CORODIST_SOURCE_DIR "/tests/collective/pytorch/torch_gloo_job.py";

boost::test_tools::assertion_result torch_available(utf::test_unit_id) {
  static const bool ok = [] {
    program p({python(), "-c", "import torch.distributed as d; assert d.is_gloo_available()"});
    return p.wait(60s) == 0;
  }();
  boost::test_tools::assertion_result r(ok);
  if (!ok)
    r.message() << "skipped: " << python() << " cannot import torch with gloo (install it: scripts/setup.sh --python)";
  return r;
}

std::shared_ptr<cs::store> pytorch_client(event_loop& loop, std::uint16_t port) {
  cs::tcp_store_options o;
  o.port = port;
  o.timeout = 60s;
  o.auth_token = "";
  o.protocol = cs::wire_protocol::pytorch_1_13;
  return cs::torch_store::connect_sync(loop.get_executor(), o);
}

/// The C++ side of torch_gloo_job.py's collectives(); returns what went wrong ("" if nothing).
std::string run_job(cc::process_group& pg, int cpp_rank) {
  const int rank = pg.rank(), world = pg.size();
  std::string bad;
  auto expect = [&](bool ok, const char* what) {
    if (!ok)
      bad += std::string(what) + "; ";
  };
  std::vector<float> a(1000, static_cast<float>(rank + 1));
  pg.allreduce(a).get();
  expect(a[0] == static_cast<float>(world * (world + 1) / 2) && a[999] == a[0], "allreduce sum");
  std::vector<std::int64_t> b(17, 0);
  if (rank == cpp_rank)
    for (int i = 0; i < 17; ++i)
      b[static_cast<std::size_t>(i)] = 3 * i;
  pg.broadcast(b, cpp_rank).get();
  expect(b[16] == 48 && b[1] == 3, "broadcast from the C++ rank");
  std::vector<double> in(5, static_cast<double>(rank)), out(5 * static_cast<std::size_t>(world), -1.0);
  pg.allgather(in, out).get();
  for (int r = 0; r < world; ++r)
    expect(out[static_cast<std::size_t>(5 * r + 4)] == r, "allgather");
  pg.barrier().get();
  std::vector<std::int32_t> m{rank, -rank, 7 * rank};
  pg.allreduce(m, cc::reduce_op::max).get();
  expect(m == std::vector<std::int32_t>{world - 1, 0, 7 * (world - 1)}, "allreduce max");
  std::vector<float> c(3, rank == 0 ? 42.0f : 0.0f);
  pg.broadcast(c, 0).get();
  expect(c[2] == 42.0f, "broadcast from rank 0");
  std::vector<float> big(262144);
  std::iota(big.begin(), big.end(), 0.0f);
  for (auto& x : big)
    x *= static_cast<float>(rank + 1);
  pg.allreduce(big).get();
  expect(big[262143] == 262143.0f * static_cast<float>(world * (world + 1) / 2), "1 MiB allreduce");
  pg.barrier().get();
  return bad;
}

/// The C++ side of torch_gloo_job.py's subgroups(): new_group over the same
/// rank lists as subgroup_lists() there, an allreduce in each group this rank
/// is a member of, then one on the whole job; returns what went wrong.
std::string run_subgroups(event_loop& loop, const std::shared_ptr<cc::process_group>& pg, int cpp_rank) {
  const int rank = pg->rank(), world = pg->size();
  std::vector<int> others;
  for (int r = 0; r < world; ++r)
    if (r != cpp_rank)
      others.push_back(r);
  const std::vector<std::vector<int>> lists{{cpp_rank, 1}, others, {0, 2, 3}};
  std::string bad;
  try { // PyTorch has no split: refused before anything is sent
    (void)corodist::run_blocking(loop.get_executor(), pg->split(0, rank), "split");
    bad += "split on a PyTorch group did not throw; ";
  } catch (const corodist::usage_error&) {
  }
  for (const auto& ranks : lists) {
    auto g = corodist::run_blocking(loop.get_executor(), cc::new_group(pg, ranks), "new_group");
    const bool member = std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
    if (member != (g != nullptr)) {
      bad += "membership; ";
      continue;
    }
    if (!g)
      continue;
    int want = 0;
    for (int r : ranks)
      want += r + 1;
    std::vector<float> t(8);
    for (std::size_t i = 0; i < t.size(); ++i)
      t[i] = static_cast<float>(i) * static_cast<float>(rank + 1);
    g->allreduce(t).get();
    for (std::size_t i = 0; i < t.size(); ++i)
      if (t[i] != static_cast<float>(i) * static_cast<float>(want))
        bad += "subgroup allreduce; ";
  }
  std::vector<std::int64_t> all{rank + 1};
  pg->allreduce(all).get();
  if (all[0] != world * (world + 1) / 2)
    bad += "allreduce on the whole job after the subgroups; ";
  return bad;
}

/// The C++ side of torch_gloo_job.py's exchanges(); returns what went wrong ("" if nothing).
std::string run_exchanges(cc::process_group& pg, int cpp_rank) {
  const int rank = pg.rank(), world = pg.size();
  const auto n = static_cast<std::size_t>(world);
  std::string bad;
  auto expect = [&](bool ok, const char* what) {
    if (!ok)
      bad += std::string(what) + "; ";
  };
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  std::vector<float> out(6), in(6, 0.0f);
  for (int i = 0; i < 6; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<float>(i + 100 * rank);
  pg.batch_isend_irecv({cc::p2p_op::isend(out, next, 5), cc::p2p_op::irecv(in, prev, 5)}).get();
  expect(in[0] == static_cast<float>(100 * prev) && in[5] == static_cast<float>(5 + 100 * prev), "isend/irecv ring");

  std::vector<std::int64_t> even_in, even_out(2 * n, -1), even_want;
  for (int j = 0; j < world; ++j)
    for (int k = 0; k < 2; ++k) {
      even_in.push_back(rank * 10 + j);
      even_want.push_back(j * 10 + rank);
    }
  pg.all_to_all_single(even_in, even_out).get();
  expect(even_out == even_want, "all_to_all_single even");

  std::vector<std::size_t> ins, outs;
  std::vector<float> un_in, un_want;
  for (int d = 0; d < world; ++d) {
    ins.push_back(static_cast<std::size_t>((rank + d) % 3 + 1));
    outs.push_back(static_cast<std::size_t>((d + rank) % 3 + 1));
    un_in.insert(un_in.end(), ins.back(), static_cast<float>(rank * 100 + d));
    un_want.insert(un_want.end(), outs.back(), static_cast<float>(d * 100 + rank));
  }
  std::vector<float> un_out(un_want.size(), -1.0f);
  pg.all_to_all_single(un_in, un_out, ins, outs).get();
  expect(un_out == un_want, "all_to_all_single uneven");

  std::vector<double> g_in(4, static_cast<double>(rank)), g_out(rank == cpp_rank ? 4 * n : 0);
  pg.gather(g_in, g_out, cpp_rank).get();
  if (rank == cpp_rank)
    for (int r = 0; r < world; ++r)
      expect(g_out[static_cast<std::size_t>(4 * r + 3)] == r, "gather");

  std::vector<std::int32_t> s_in, s_out(3, -1);
  if (rank == 0)
    for (int j = 0; j < world; ++j)
      s_in.insert(s_in.end(), 3, j * 7);
  pg.scatter(s_in, s_out, 0).get();
  expect(s_out == std::vector<std::int32_t>(3, rank * 7), "scatter");

  std::vector<float> r_sum(1000, static_cast<float>(rank + 1));
  pg.reduce(r_sum, cpp_rank).get();
  if (rank == cpp_rank)
    expect(r_sum[999] == static_cast<float>(world * (world + 1) / 2), "reduce sum");
  std::vector<std::int64_t> r_max{rank, 5 - rank};
  pg.reduce(r_max, 0, cc::reduce_op::max).get();
  if (rank == 0)
    expect(r_max == std::vector<std::int64_t>{world - 1, 5}, "reduce max");
  pg.barrier().get();
  return bad;
}

cc::gloo_options pytorch_options(std::string store_prefix) {
  cc::gloo_options o;
  o.host = "127.0.0.1";
  o.timeout = 60s;
  o.pytorch = cc::pytorch_options{.group_index = 0, .store_prefix = std::move(store_prefix)};
  return o;
}

} // namespace

BOOST_AUTO_TEST_SUITE(pytorch_interop, *utf::precondition(corodist::test::gloo_built))

// Two PyTorch ranks (0, 1) on PyTorch's TCPStore master, init_method layout;
// the C++ rank is 2.
BOOST_AUTO_TEST_CASE(cpp_rank_joins_pytorch_ranks_on_their_master, *utf::precondition(torch_available) *
                                                                       utf::timeout(200)) {
  program job({"timeout", "150", python(), job_script, "pytorch-master", "3"});
  auto line = job.read_line(60s);
  BOOST_REQUIRE_MESSAGE(line && line->rfind("PORT ", 0) == 0, "no port from the job: " << job.output());
  const auto port = static_cast<std::uint16_t>(std::stoi(line->substr(5)));
  event_loop loop;
  loop.start();
  auto pg = cc::gloo_group::create_sync(pytorch_client(loop, port), 2, 3, pytorch_options("default_pg"));
  BOOST_TEST(run_job(*pg, 2) == "");
  BOOST_TEST(run_exchanges(*pg, 2) == "");
  const int rc = job.wait(120s);
  BOOST_TEST_INFO("torch_gloo_job.py output:\n" << job.output());
  BOOST_TEST(rc == 0);
  BOOST_TEST(job.output().find("OK") != std::string::npos);
}

// Rank 0 in C++ hosts the store (corodist's server speaks PyTorch's protocol);
// PyTorch ranks 1 and 2 pass store= to init_process_group.
BOOST_AUTO_TEST_CASE(cpp_rank_0_hosts_the_store_for_pytorch_ranks, *utf::precondition(torch_available) *
                                                                        utf::timeout(200)) {
  event_loop loop;
  loop.start();
  cs::server_options so;
  so.auth_token = "";
  auto server = cs::store_server::start(loop.get_executor(), so);
  const auto port = server->local_endpoint().port();
  program job({"timeout", "150", python(), job_script, "cpp-master", "3", std::to_string(port)});
  auto pg = cc::gloo_group::create_sync(pytorch_client(loop, port), 0, 3, pytorch_options(""));
  BOOST_TEST(run_job(*pg, 0) == "");
  BOOST_TEST(run_exchanges(*pg, 0) == "");
  const int rc = job.wait(120s);
  BOOST_TEST_INFO("torch_gloo_job.py output:\n" << job.output());
  BOOST_TEST(rc == 0);
  BOOST_TEST(job.output().find("OK") != std::string::npos);
}

// new_group over subsets in a job of three PyTorch ranks and the C++ rank 3
// (on PyTorch's master): PyTorch's group numbers, keys and store-based
// barrier, members and non-members (the C++ rank is not in the second group).
BOOST_AUTO_TEST_CASE(new_group_over_a_subset_with_pytorch_ranks, *utf::precondition(torch_available) *
                                                                       utf::timeout(200)) {
  program job({"timeout", "150", python(), job_script, "pytorch-master", "4", "--subgroups"});
  auto line = job.read_line(60s);
  BOOST_REQUIRE_MESSAGE(line && line->rfind("PORT ", 0) == 0, "no port from the job: " << job.output());
  const auto port = static_cast<std::uint16_t>(std::stoi(line->substr(5)));
  event_loop loop;
  loop.start();
  std::shared_ptr<cc::process_group> pg =
      cc::gloo_group::create_sync(pytorch_client(loop, port), 3, 4, pytorch_options("default_pg"));
  BOOST_TEST(run_subgroups(loop, pg, 3) == "");
  const int rc = job.wait(120s);
  BOOST_TEST_INFO("torch_gloo_job.py output:\n" << job.output());
  BOOST_TEST(rc == 0);
  BOOST_TEST(job.output().find("OK") != std::string::npos);
}

// The same with the C++ rank 0 hosting the store (PyTorch ranks pass store=).
BOOST_AUTO_TEST_CASE(new_group_over_a_subset_with_cpp_rank_0_hosting, *utf::precondition(torch_available) *
                                                                           utf::timeout(200)) {
  event_loop loop;
  loop.start();
  cs::server_options so;
  so.auth_token = "";
  auto server = cs::store_server::start(loop.get_executor(), so);
  const auto port = server->local_endpoint().port();
  program job({"timeout", "150", python(), job_script, "cpp-master", "4", std::to_string(port), "--subgroups"});
  std::shared_ptr<cc::process_group> pg = cc::gloo_group::create_sync(pytorch_client(loop, port), 0, 4, pytorch_options(""));
  BOOST_TEST(run_subgroups(loop, pg, 0) == "");
  const int rc = job.wait(120s);
  BOOST_TEST_INFO("torch_gloo_job.py output:\n" << job.output());
  BOOST_TEST(rc == 0);
  BOOST_TEST(job.output().find("OK") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
