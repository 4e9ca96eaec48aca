// gloo_group with CUDA buffers, staged through page-locked host memory (as
// PyTorch's ProcessGroupGloo): two ranks (threads) on one GPU, which NCCL
// refuses. Exact values (small integers, sums exact in every dtype used).
#include <boost/test/unit_test.hpp>

#include <corodist/collective/cuda_stream.hpp>
#include <corodist/collective/device_buffer.hpp>
#include <corodist/collective/errors.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/error.hpp>

#include "collective/cuda_fixtures.hpp"
#include "collective/gloo_fixtures.hpp"

#include <cstring>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cc = corodist::collective;
namespace ct = corodist::test;

BOOST_AUTO_TEST_SUITE(gloo_cuda)

// Without a GPU, a CUDA buffer is refused at the call with cuda_error saying
// why; nothing is issued (the sequence number stays).
BOOST_AUTO_TEST_CASE(cuda_buffer_without_cuda_says_why, *utf::precondition(ct::gloo_without_cuda) * utf::timeout(30)) {
  ct::thread_ranks job;
  auto pg = job.group(0, 1, ct::gloo_test_options("gloo_cuda/none"));
  const auto reason = cc::cuda_stream::unavailable_reason();
  alignas(16) static float fake[4]; // never touched: refused before any copy
  const cc::tensor_view on_gpu(fake, 4, cc::dtype::float32, cc::device::cuda(0));
  BOOST_CHECK_EXCEPTION((void)pg->allreduce(on_gpu), cc::cuda_error, [&](const cc::cuda_error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return std::string(e.what()).find(reason) != std::string::npos;
  });
  BOOST_TEST(pg->sequence_number() == 0u);
  std::vector<float> host(4, 1.0f);
  pg->allreduce(host).get(); // the group is still usable
  BOOST_TEST(host[3] == 1.0f);
}

#if CORODIST_TEST_CUDA
// allreduce (sum and avg; float32, float16 and bfloat16), broadcast,
// allgather, reduce_scatter and allreduce_coalesced on device buffers of
// one GPU, two ranks: exact values; results in device memory once the work
// completes (read back on a stream of the test's own).
BOOST_AUTO_TEST_CASE(collectives_on_one_gpu, *utf::precondition(ct::gloo_and_cuda) * utf::timeout(120)) {
  constexpr int size = 2;
  const std::size_t n = 4099;
  ct::thread_ranks job;
  auto errors = job.run(size, [&](int r) {
    auto pg = job.group(r, size, ct::gloo_test_options("gloo_cuda/all"));
    RANK_REQUIRE(pg->control_device() == cc::device::cpu());
    for (auto type : {cc::dtype::float32, cc::dtype::float16, cc::dtype::bfloat16}) {
      const std::string t(cc::to_string(type));
      auto buf = ct::to_device(0, type, ct::small_values(r, n));
      const auto v = ct::view_of(buf, type, n);
      pg->allreduce(v).get();
      ct::require_equal(ct::from_device(v), ct::small_sums(size, n), "allreduce sum " + t);
      buf = ct::to_device(0, type, ct::small_values(r, n)); // afresh: the mean of the ranks' values
      const auto fresh = ct::view_of(buf, type, n);
      pg->allreduce(fresh, cc::reduce_op::avg).get();
      ct::require_equal(ct::from_device(fresh), ct::divided(ct::small_sums(size, n), size), "allreduce avg " + t);
    }
    // broadcast from rank 1.
    auto b = ct::to_device(0, cc::dtype::float32, ct::small_values(r, n));
    const auto bv = ct::view_of(b, cc::dtype::float32, n);
    pg->broadcast(bv, 1).get();
    ct::require_equal(ct::from_device(bv), ct::small_values(1, n), "broadcast");
    // allgather: rank q's values at q * n.
    auto in = ct::to_device(0, cc::dtype::float32, ct::small_values(r, n));
    auto out = ct::to_device(0, cc::dtype::float32, std::vector<float>(size * n, -1.0f));
    pg->allgather(ct::view_of(in, cc::dtype::float32, n), ct::view_of(out, cc::dtype::float32, size * n)).get();
    std::vector<float> gathered;
    for (int q = 0; q < size; ++q)
      for (float x : ct::small_values(q, n))
        gathered.push_back(x);
    ct::require_equal(ct::from_device(ct::view_of(out, cc::dtype::float32, size * n)), gathered, "allgather");
    // reduce_scatter: chunk r of the sum.
    auto whole = ct::to_device(0, cc::dtype::float32, ct::small_values(r, size * n));
    auto mine = ct::to_device(0, cc::dtype::float32, std::vector<float>(n, -1.0f));
    pg->reduce_scatter(ct::view_of(whole, cc::dtype::float32, size * n), ct::view_of(mine, cc::dtype::float32, n))
        .get();
    ct::require_equal(ct::from_device(ct::view_of(mine, cc::dtype::float32, n)), ct::small_sums(size, n, r * n), "reduce_scatter");
    // allreduce_coalesced over buffers of two dtypes and sizes.
    auto c1 = ct::to_device(0, cc::dtype::float32, ct::small_values(r, 300));
    auto c2 = ct::to_device(0, cc::dtype::float16, ct::small_values(r, 77, 5));
    auto c3 = ct::to_device(0, cc::dtype::float32, ct::small_values(r, 1, 9));
    std::vector<cc::tensor_view> bufs = {ct::view_of(c1, cc::dtype::float32, 300),
                                         ct::view_of(c2, cc::dtype::float16, 77),
                                         ct::view_of(c3, cc::dtype::float32, 1)};
    pg->allreduce_coalesced(bufs).get();
    ct::require_equal(ct::from_device(bufs[0]), ct::small_sums(size, 300), "allreduce_coalesced float32");
    ct::require_equal(ct::from_device(bufs[1]), ct::small_sums(size, 77, 5), "allreduce_coalesced float16");
    ct::require_equal(ct::from_device(bufs[2]), ct::small_sums(size, 1, 9), "allreduce_coalesced one element");
    pg->barrier().get();
    RANK_REQUIRE(pg->sequence_number() == 11u);
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

// call_options::stream: the staged collective starts after the work queued
// on the caller's stream. The values are copied into the buffer on a held
// stream; the allreduce issued after that copy must see them.
BOOST_AUTO_TEST_CASE(collective_waits_for_the_callers_stream, *utf::precondition(ct::gloo_and_cuda) * utf::timeout(120)) {
  constexpr int size = 2;
  const std::size_t n = 1 << 16;
  ct::thread_ranks job;
  auto errors = job.run(size, [&](int r) {
    auto pg = job.group(r, size, ct::gloo_test_options("gloo_cuda/stream"));
    const auto user = cc::cuda_stream::create(0);
    auto buf = ct::to_device(0, cc::dtype::float32, std::vector<float>(n, 0.0f));
    auto pinned = cc::device_buffer::allocate(cc::device::cpu(), n * sizeof(float));
    const auto mine = ct::small_values(r, n);
    std::memcpy(pinned.data(), mine.data(), n * sizeof(float));
    const auto v = ct::view_of(buf, cc::dtype::float32, n);
    bool expired = false;
    {
      ct::stream_gate gate(user);
      user.copy(buf.data(), pinned.data(), n * sizeof(float));
      cc::call_options o;
      o.stream = user.native();
      auto w = pg->allreduce(v, cc::reduce_op::sum, o);
      gate.open();
      w.get();
      expired = gate.expired();
    }
    RANK_REQUIRE(!expired);
    ct::require_equal(ct::from_device(v), ct::small_sums(size, n), "allreduce after the caller's stream");
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

// The buffers of one call are on one device: host and CUDA buffers together
// are refused at the call.
BOOST_AUTO_TEST_CASE(host_and_cuda_buffers_in_one_call_are_refused,
                     *utf::precondition(ct::gloo_and_cuda) * utf::timeout(60)) {
  ct::thread_ranks job;
  auto pg = job.group(0, 1, ct::gloo_test_options("gloo_cuda/mixed"));
  auto dev = ct::to_device(0, cc::dtype::float32, std::vector<float>(8, 1.0f));
  std::vector<float> host(8, 1.0f);
  std::vector<cc::tensor_view> mixed = {cc::tensor_view(host), ct::view_of(dev, cc::dtype::float32, 8)};
  BOOST_CHECK_EXCEPTION((void)pg->allreduce_coalesced(mixed), corodist::usage_error,
                        [](const corodist::usage_error& e) {
                          BOOST_TEST_MESSAGE(e.what());
                          return true;
                        });
  BOOST_TEST(pg->sequence_number() == 0u);
  // One device per call, each: fine.
  pg->allreduce(ct::view_of(dev, cc::dtype::float32, 8)).get();
  pg->allreduce(host).get();
  BOOST_TEST(ct::first_difference(ct::from_device(ct::view_of(dev, cc::dtype::float32, 8)),
                                  std::vector<float>(8, 1.0f)) == "");
}
#endif

BOOST_AUTO_TEST_SUITE_END()
