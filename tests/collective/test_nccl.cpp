// The NCCL backend: it is built where CUDA and NCCL are found; its tests need
// a GPU and say why they are skipped without one.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/errors.hpp>
#include <corodist/collective/nccl_group.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/store/hash_store.hpp>

#include "collective/gloo_fixtures.hpp"

#if CORODIST_TEST_CUDA
#include <cuda_runtime_api.h>
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
#endif

BOOST_AUTO_TEST_SUITE_END()
