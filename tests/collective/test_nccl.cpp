// The NCCL backend: it is built where CUDA and NCCL are found; its tests need
// a GPU and say why they are skipped without one.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/errors.hpp>
#include <corodist/collective/nccl_group.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/hash_store.hpp>

#include "collective/gloo_fixtures.hpp"

#if CORODIST_TEST_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <latch>
#endif

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cc = corodist::collective;

namespace {

#if CORODIST_TEST_CUDA
boost::test_tools::assertion_result gpu_present(utf::test_unit_id) {
  const auto why = cc::nccl_group::unavailable_reason();
  boost::test_tools::assertion_result r(why.empty());
  if (!why.empty())
    r.message() << "skipped: NCCL cannot run here: " << why;
  return r;
}

// Two CUDA devices or more (NCCL puts each rank of a communicator on a GPU of its own).
boost::test_tools::assertion_result two_gpus(utf::test_unit_id id) {
  auto r = gpu_present(id);
  if (!r)
    return r;
  int n = 0;
  cudaGetDeviceCount(&n);
  boost::test_tools::assertion_result out(n >= 2);
  if (!out)
    out.message() << "skipped: a real shrink needs 2 CUDA devices or more, found " << n;
  return out;
}

// The NCCL this test was built with and the one loaded have ncclCommShrink
// (2.27), and ncclCommRevoke (2.28, which keeps an aborted communicator).
bool nccl_at_least(int code) {
  int loaded = 0;
  ncclGetVersion(&loaded);
  return NCCL_VERSION_CODE >= code && loaded >= code;
}

// Two GPUs and an NCCL with ncclCommShrink.
boost::test_tools::assertion_result two_gpus_and_shrink(utf::test_unit_id id) {
  auto r = two_gpus(id);
  if (!r)
    return r;
  boost::test_tools::assertion_result out(nccl_at_least(NCCL_VERSION(2, 27, 0)));
  if (!out)
    out.message() << "skipped: this NCCL has no ncclCommShrink (2.27 or later has it)";
  return out;
}

std::vector<float> to_host(const float* d, std::size_t n) {
  std::vector<float> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  return h;
}
#endif

boost::test_tools::assertion_result built_without_gpu(utf::test_unit_id) {
  boost::test_tools::assertion_result r(cc::nccl_group::built() && !cc::nccl_group::unavailable_reason().empty());
  if (!r)
    r.message() << "skipped: " << (cc::nccl_group::built() ? "a GPU is present" : "built without NCCL");
  return r;
}

} // namespace

BOOST_AUTO_TEST_SUITE(nccl)

// Without a usable GPU, creation fails with an error that says why, at once.
BOOST_AUTO_TEST_CASE(creation_without_a_gpu_says_why, *utf::precondition(built_without_gpu) * utf::timeout(30)) {
  corodist::event_loop loop;
  loop.start();
  auto store = std::make_shared<corodist::store::hash_store>(loop.get_executor());
  BOOST_CHECK_EXCEPTION(cc::nccl_group::create_sync(loop.get_executor(), store, 0, 1), cc::collective_error,
                        [](const cc::collective_error& e) {
                          BOOST_TEST_MESSAGE(e.what());
                          return std::string(e.what()).find("no CUDA device") != std::string::npos &&
                                 e.op() == "create";
                        });
}

#if CORODIST_TEST_CUDA
// Two ranks (threads) on GPU 0 (or 0 and 1): allreduce (sum, avg),
// broadcast, allgather, reduce_scatter and barrier on device buffers.
BOOST_AUTO_TEST_CASE(collectives_on_device_buffers, *utf::precondition(gpu_present) * utf::timeout(120)) {
  int devices = 0;
  cudaGetDeviceCount(&devices);
  corodist::test::thread_ranks job;
  auto errors = job.run(2, [&](int r) {
    corodist::event_loop loop;
    loop.start();
    cc::nccl_options o;
    o.device = r % devices;
    o.timeout = 60s;
    auto pg = cc::nccl_group::create_sync(loop.get_executor(), job.store, r, 2, o);
    cudaSetDevice(o.device);
    const std::size_t n = 1 << 20;
    float* d = nullptr;
    RANK_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), n * 3 * sizeof(float)) == cudaSuccess);
    const auto dev = cc::device::cuda(o.device);
    auto view = [&](std::size_t off, std::size_t count) { return cc::tensor_view(d + off, count, cc::dtype::float32, dev); };
    auto fetch = [&](std::size_t off, std::size_t count) {
      std::vector<float> h(count);
      cudaMemcpy(h.data(), d + off, count * sizeof(float), cudaMemcpyDeviceToHost);
      return h;
    };
    std::vector<float> h(n, static_cast<float>(r + 1));
    cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    pg->allreduce(view(0, n)).get();
    RANK_REQUIRE(fetch(0, n)[n - 1] == 3.0f);
    pg->allreduce(view(0, n), cc::reduce_op::avg).get();
    RANK_REQUIRE(fetch(0, n)[0] == 3.0f);
    std::fill(h.begin(), h.end(), static_cast<float>(r + 1));
    cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    pg->broadcast(view(0, n), 1).get();
    RANK_REQUIRE(fetch(0, n)[7] == 2.0f);
    cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    pg->allgather(view(0, n), view(n, 2 * n)).get();
    auto g = fetch(n, 2 * n);
    RANK_REQUIRE(g[0] == 1.0f && g[2 * n - 1] == 2.0f);
    pg->reduce_scatter(view(n, 2 * n), view(0, n)).get();
    RANK_REQUIRE(fetch(0, n)[0] == (r == 0 ? 2.0f : 4.0f));
    pg->barrier().get();
    RANK_REQUIRE(pg->sequence_number() == 6u);
    cudaFree(d);
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

// shrink's argument checks, on a group of one rank (which cannot shrink: any
// rank given is out of range or itself); whether shrink can run follows the
// NCCL version, before and after an abort.
BOOST_AUTO_TEST_CASE(shrink_rejects_bad_ranks, *utf::precondition(gpu_present) * utf::timeout(60)) {
  corodist::event_loop loop;
  loop.start();
  auto store = std::make_shared<corodist::store::hash_store>(loop.get_executor());
  cc::nccl_options o;
  o.prefix = "shrink/usage";
  o.timeout = 30s;
  auto pg = cc::nccl_group::create_sync(loop.get_executor(), store, 0, 1, o);
  const auto ex = loop.get_executor();
  auto shrink = [&](std::vector<int> lost) { return corodist::run_blocking(ex, pg->shrink(std::move(lost)), "shrink"); };
  auto rejected = [&](std::vector<int> lost, const std::string& words) {
    BOOST_CHECK_EXCEPTION(shrink(lost), corodist::usage_error, [&](const corodist::usage_error& e) {
      BOOST_TEST_MESSAGE(e.what());
      return std::string(e.what()).find(words) != std::string::npos;
    });
  };
  rejected({}, "no rank to leave out");
  rejected({1}, "rank 1 is not a rank of this group");
  rejected({-1}, "rank -1 is not a rank of this group");
  rejected({0, 0}, "rank 0 is given twice");
  rejected({0}, "no rank would be left");
  BOOST_TEST(pg->shrink_unavailable_reason().empty() == nccl_at_least(NCCL_VERSION(2, 27, 0)),
             pg->shrink_unavailable_reason());
  pg->abort("the test aborts");
  BOOST_TEST(pg->aborted());
  // Revoked and kept (NCCL 2.28), else aborted and gone.
  BOOST_TEST(pg->shrink_unavailable_reason().empty() == nccl_at_least(NCCL_VERSION(2, 28, 0)),
             pg->shrink_unavailable_reason());
  rejected({0}, "no rank would be left");
}

// Ranks on GPUs 0..n-1 (n = 2 or 3): rank n-2 is lost (it aborts its group
// and leaves); the others' next allreduce fails, their groups are aborted
// (revoked), and they shrink without it: renumbered in order, and the new
// group reduces over the survivors only.
BOOST_AUTO_TEST_CASE(shrink_without_a_lost_rank, *utf::precondition(two_gpus_and_shrink) * utf::timeout(240)) {
  int devices = 0;
  cudaGetDeviceCount(&devices);
  const int n = std::min(devices, 3);
  const int lost = n - 2;
  corodist::test::thread_ranks job;
  auto errors = job.run(n, [&](int r) {
    corodist::event_loop loop;
    loop.start();
    const auto ex = loop.get_executor();
    cc::nccl_options o;
    o.prefix = "shrink/lost";
    o.device = r;
    o.timeout = 60s;
    auto pg = cc::nccl_group::create_sync(ex, job.store, r, n, o);
    cudaSetDevice(r);
    float* d = nullptr;
    RANK_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(float)) == cudaSuccess);
    const auto dev = cc::device::cuda(r);
    const float mine = static_cast<float>(r + 1);
    cudaMemcpy(d, &mine, sizeof(float), cudaMemcpyHostToDevice);
    pg->allreduce(cc::tensor_view(d, 1, cc::dtype::float32, dev)).get();
    RANK_REQUIRE(to_host(d, 1)[0] == static_cast<float>(n * (n + 1) / 2));
    if (r == lost) {
      pg->abort("this rank is lost");
      pg.reset();
      cudaFree(d);
      return;
    }
    cc::call_options short_wait;
    short_wait.timeout = 5s;
    bool failed = false;
    try {
      pg->allreduce(cc::tensor_view(d, 1, cc::dtype::float32, dev), cc::reduce_op::sum, short_wait).get();
    } catch (const cc::collective_failure&) {
      failed = true;
    }
    RANK_REQUIRE(failed && pg->aborted());
    auto usage = [&](std::vector<int> ranks) {
      try {
        (void)corodist::run_blocking(ex, pg->shrink(std::move(ranks)), "shrink");
      } catch (const corodist::usage_error&) {
        return true;
      }
      return false;
    };
    RANK_REQUIRE(usage({r}));  // this rank
    RANK_REQUIRE(usage({lost, lost}));  // twice
    RANK_REQUIRE(usage({n}));  // out of range
    if (!nccl_at_least(NCCL_VERSION(2, 28, 0))) {
      // No ncclCommRevoke: the abort freed the communicator; nothing is left to shrink.
      RANK_REQUIRE(!pg->shrink_unavailable_reason().empty());
      cudaFree(d);
      return;
    }
    RANK_REQUIRE(pg->shrink_unavailable_reason().empty());
    o.prefix = "shrink/lost/survivors";
    o.device = -1;
    auto small = corodist::run_blocking(ex, pg->shrink({lost}, o), "shrink");
    RANK_REQUIRE(small->size() == n - 1);
    RANK_REQUIRE(small->rank() == (r < lost ? r : r - 1));
    RANK_REQUIRE(small->cuda_device() == r);
    RANK_REQUIRE(!small->aborted());
    cudaMemcpy(d, &mine, sizeof(float), cudaMemcpyHostToDevice);
    small->allreduce(cc::tensor_view(d, 1, cc::dtype::float32, dev)).get();
    RANK_REQUIRE(to_host(d, 1)[0] == static_cast<float>(n * (n + 1) / 2 - (lost + 1)));
    small->barrier().get();
    RANK_REQUIRE(small->sequence_number() == 2u);
    cudaFree(d);
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

// A healthy group shrinks without its last rank, which stays until the
// others are done (NCCL_SHRINK_DEFAULT): the old group is still usable.
BOOST_AUTO_TEST_CASE(shrink_of_a_healthy_group, *utf::precondition(two_gpus_and_shrink) * utf::timeout(240)) {
  int devices = 0;
  cudaGetDeviceCount(&devices);
  const int n = std::min(devices, 3);
  std::latch survivors_done(n - 1);
  corodist::test::thread_ranks job;
  auto errors = job.run(n, [&](int r) {
    corodist::event_loop loop;
    loop.start();
    const auto ex = loop.get_executor();
    cc::nccl_options o;
    o.prefix = "shrink/healthy";
    o.device = r;
    o.timeout = 60s;
    auto pg = cc::nccl_group::create_sync(ex, job.store, r, n, o);
    if (r == n - 1) {
      survivors_done.wait();
      return;
    }
    struct done_guard {
      std::latch& done;
      ~done_guard() { done.count_down(); }
    } guard{survivors_done}; // also when this rank fails
    cudaSetDevice(r);
    float* d = nullptr;
    RANK_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(float)) == cudaSuccess);
    const auto dev = cc::device::cuda(r);
    auto small = corodist::run_blocking(ex, pg->shrink({n - 1}), "shrink");
    RANK_REQUIRE(small->rank() == r && small->size() == n - 1);
    RANK_REQUIRE(!pg->aborted());
    const float mine = static_cast<float>(r + 1);
    cudaMemcpy(d, &mine, sizeof(float), cudaMemcpyHostToDevice);
    small->allreduce(cc::tensor_view(d, 1, cc::dtype::float32, dev)).get();
    RANK_REQUIRE(to_host(d, 1)[0] == static_cast<float>((n - 1) * n / 2));
    cudaFree(d);
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}
#endif

BOOST_AUTO_TEST_SUITE_END()
