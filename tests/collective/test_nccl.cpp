// The NCCL backend: it is built where CUDA and NCCL are found; its tests need
// a GPU and say why they are skipped without one.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/errors.hpp>
#include <corodist/collective/nccl_group.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/hash_store.hpp>

#include "collective/cuda_fixtures.hpp"
#include "collective/gloo_fixtures.hpp"

#if CORODIST_TEST_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <latch>
#include <memory>
#include <string>
#include <vector>
#endif

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cc = corodist::collective;
namespace ct = corodist::test;

namespace {

#if CORODIST_TEST_CUDA
// A group of one rank on this process's first GPU, over an in-memory store.
std::shared_ptr<cc::nccl_group> one_rank_group(corodist::event_loop& loop, const std::string& prefix) {
  auto store = std::make_shared<corodist::store::hash_store>(loop.get_executor());
  cc::nccl_options o;
  o.prefix = prefix;
  o.timeout = 30s;
  return cc::nccl_group::create_sync(loop.get_executor(), store, 0, 1, o);
}

// Two CUDA devices or more (NCCL puts each rank of a communicator on a GPU of its own).
boost::test_tools::assertion_result two_gpus(utf::test_unit_id id) {
  auto r = ct::nccl_usable(id);
  if (!r)
    return r;
  int n = 0;
  cudaGetDeviceCount(&n);
  boost::test_tools::assertion_result out(n >= 2);
  if (!out)
    out.message() << "skipped: this case needs 2 CUDA devices or more (a GPU per NCCL rank), found " << n;
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

// Arrives at `done` when it goes out of scope: also when the rank's body throws.
struct arrive_on_exit {
  ct::countdown& done;
  ~arrive_on_exit() { done.arrive(); }
};

// The text of the collective_timeout_error that `w` ends with (a rank body's
// check: throws otherwise). `w` was issued with a deadline well inside 30 s.
std::string timeout_of(const cc::work& w, const std::string& what) {
  return ct::require_throws<cc::collective_timeout_error>([&] { w.wait(30s); }, what);
}

// call_options with a time limit of `limit`.
cc::call_options within(std::chrono::milliseconds limit) {
  cc::call_options co;
  co.timeout = limit;
  return co;
}

// The GPUs that NCCL's multi-rank cases use: every device, at most `cap`.
int gpu_count(int cap) { return std::min(cc::cuda_stream::device_count(), cap); }

// A group of rank r of n on GPU r (ranks as threads of this process).
std::shared_ptr<cc::nccl_group> rank_group(corodist::event_loop& loop, ct::thread_ranks& job, int r, int n,
                                           const std::string& prefix) {
  cc::nccl_options o;
  o.prefix = prefix;
  o.device = r;
  o.timeout = 60s;
  return cc::nccl_group::create_sync(loop.get_executor(), job.store, r, n, o);
}

// What rank `src` sends rank `dst` in the all-to-all cases: element k of the
// block (exact in float32).
float a2a_value(int src, int dst, std::size_t k) { return static_cast<float>(src * 1000 + dst * 100 + static_cast<int>(k)); }

std::vector<float> a2a_block(int src, int dst, std::size_t count) {
  std::vector<float> v(count);
  for (std::size_t k = 0; k < count; ++k)
    v[k] = a2a_value(src, dst, k);
  return v;
}

// Elements rank i sends rank j in the uneven cases (1 to 3; rank i's
// in_splits[j] is rank j's out_splits[i]).
std::size_t uneven_count(int i, int j) { return static_cast<std::size_t>((i + 2 * j) % 3 + 1); }

void append(std::vector<float>& to, const std::vector<float>& v) { to.insert(to.end(), v.begin(), v.end()); }

// A device buffer of float32 `values` on GPU `dev`, and its view.
struct device_floats {
  cc::device_buffer buf;
  cc::tensor_view view;
  device_floats(int dev, const std::vector<float>& values)
      : buf(ct::to_device(dev, cc::dtype::float32, values.empty() ? std::vector<float>{0.0f} : values)),
        view(buf.data(), values.size(), cc::dtype::float32, cc::device::cuda(dev)) {}
  std::vector<float> host() const { return view.count() == 0 ? std::vector<float>{} : ct::from_device(view); }
};
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
// Ranks (threads) 0..n-1 on GPUs 0..n-1 (NCCL wants a GPU per rank), for
// every n from 1 to the device count (at most 8): allreduce (sum; avg where n
// is a power of two, so that the quotients are exact), broadcast, allgather
// and reduce_scatter in float32, float16 and bfloat16, and barrier, on
// device buffers; every value checked exactly (small integers).
BOOST_AUTO_TEST_CASE(collectives_at_every_world_size, *utf::precondition(ct::nccl_usable) * utf::timeout(300)) {
  const int devices = std::min(cc::cuda_stream::device_count(), 8);
  for (int n = 1; n <= devices; ++n) {
    BOOST_TEST_MESSAGE("world size " << n);
    corodist::test::thread_ranks job;
    auto errors = job.run(n, [&](int r) {
      corodist::event_loop loop;
      loop.start();
      cc::nccl_options o;
      o.prefix = "all/" + std::to_string(n);
      o.device = r;
      o.timeout = 60s;
      auto pg = cc::nccl_group::create_sync(loop.get_executor(), job.store, r, n, o);
      RANK_REQUIRE(pg->cuda_device() == r);
      RANK_REQUIRE(pg->control_device() == cc::device::cuda(r));
      const std::size_t c = 1003;
      std::uint64_t issued = 0;
      for (auto type : {cc::dtype::float32, cc::dtype::float16, cc::dtype::bfloat16}) {
        const std::string t = std::string(cc::to_string(type)) + " at world size " + std::to_string(n);
        auto buf = ct::to_device(r, type, ct::small_values(r, c));
        const auto v = ct::view_of(buf, type, c);
        pg->allreduce(v).get();
        ct::require_equal(ct::from_device(v), ct::small_sums(n, c), "allreduce sum " + t);
        ++issued;
        if ((n & (n - 1)) == 0) {
          buf = ct::to_device(r, type, ct::small_values(r, c));
          const auto a = ct::view_of(buf, type, c);
          pg->allreduce(a, cc::reduce_op::avg).get();
          ct::require_equal(ct::from_device(a), ct::divided(ct::small_sums(n, c), n), "allreduce avg " + t);
          ++issued;
        }
        auto b = ct::to_device(r, type, ct::small_values(r, c));
        pg->broadcast(ct::view_of(b, type, c), n - 1).get();
        ct::require_equal(ct::from_device(ct::view_of(b, type, c)), ct::small_values(n - 1, c), "broadcast " + t);
        auto out = ct::to_device(r, type, std::vector<float>(n * c, -1.0f));
        pg->allgather(ct::view_of(b, type, c), ct::view_of(out, type, n * c)).get(); // b holds rank n-1's values now
        auto in = ct::to_device(r, type, ct::small_values(r, c));
        pg->allgather(ct::view_of(in, type, c), ct::view_of(out, type, n * c)).get();
        std::vector<float> gathered;
        for (int q = 0; q < n; ++q)
          for (float x : ct::small_values(q, c))
            gathered.push_back(x);
        ct::require_equal(ct::from_device(ct::view_of(out, type, n * c)), gathered, "allgather " + t);
        auto whole = ct::to_device(r, type, ct::small_values(r, n * c));
        auto mine = ct::to_device(r, type, std::vector<float>(c, -1.0f));
        pg->reduce_scatter(ct::view_of(whole, type, n * c), ct::view_of(mine, type, c)).get();
        ct::require_equal(ct::from_device(ct::view_of(mine, type, c)), ct::small_sums(n, c, r * c),
                          "reduce_scatter " + t);
        issued += 4;
      }
      pg->barrier().get();
      ++issued;
      RANK_REQUIRE(pg->sequence_number() == issued);
      RANK_REQUIRE(!pg->aborted());
    });
    for (auto& e : errors)
      BOOST_TEST(e.empty(), e);
  }
}

// call_options::stream: the collective is enqueued after the work queued on
// the caller's stream. The values reach the buffer by a copy on a held
// stream; the allreduce issued after that copy must reduce them, not the zeros before.
BOOST_AUTO_TEST_CASE(collective_waits_for_the_callers_stream, *utf::precondition(ct::nccl_usable) * utf::timeout(60)) {
  corodist::event_loop loop;
  loop.start();
  auto pg = one_rank_group(loop, "stream");
  const int dev = pg->cuda_device();
  const std::size_t n = 1 << 16;
  const auto user = cc::cuda_stream::create(dev);
  auto buf = ct::to_device(dev, cc::dtype::float32, std::vector<float>(n, 0.0f));
  auto pinned = cc::device_buffer::allocate(cc::device::cpu(), n * sizeof(float));
  const auto want = ct::small_values(0, n);
  std::memcpy(pinned.data(), want.data(), n * sizeof(float));
  const auto v = ct::view_of(buf, cc::dtype::float32, n);
  {
    ct::stream_gate gate(user);
    user.copy(buf.data(), pinned.data(), n * sizeof(float));
    cc::call_options co;
    co.stream = user.native();
    auto w = pg->allreduce(v, cc::reduce_op::sum, co);
    gate.open();
    w.wait(20s);
    BOOST_TEST(!gate.expired());
  }
  BOOST_TEST(ct::first_difference(ct::from_device(v), want) == "");
}

// abort(): a collective pending behind a held stream fails with
// collective_error naming the reason, and so does a later one; the group
// says it is aborted. (The held stream is let go after.)
BOOST_AUTO_TEST_CASE(abort_fails_pending_and_later_collectives, *utf::precondition(ct::nccl_usable) * utf::timeout(60)) {
  corodist::event_loop loop;
  loop.start();
  auto pg = one_rank_group(loop, "abort");
  const int dev = pg->cuda_device();
  auto buf = ct::to_device(dev, cc::dtype::float32, std::vector<float>(256, 1.0f));
  const auto v = ct::view_of(buf, cc::dtype::float32, 256);
  const auto user = cc::cuda_stream::create(dev);
  auto names_reason = [](const cc::collective_error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return std::string(e.what()).find("the test aborts") != std::string::npos;
  };
  {
    ct::stream_gate gate(user);
    cc::call_options co;
    co.stream = user.native();
    auto pending = pg->allreduce(v, cc::reduce_op::sum, co);
    BOOST_TEST(!pending.is_completed());
    pg->abort("the test aborts");
    BOOST_TEST(pg->aborted());
    BOOST_CHECK_EXCEPTION(pending.wait(20s), cc::collective_error, names_reason);
    BOOST_CHECK_EXCEPTION(pg->allreduce(v).wait(20s), cc::collective_error, names_reason);
    BOOST_CHECK_EXCEPTION(pg->barrier().wait(20s), cc::collective_error, names_reason);
    gate.open();
  }
  pg->abort("again"); // idempotent
  BOOST_TEST(pg->aborted());
}

// The deadline at world size 1: a collective behind a stream held past its
// deadline fails with collective_timeout_error (the watchdog of the group's
// poll) and aborts the group: a later collective fails with collective_error.
BOOST_AUTO_TEST_CASE(deadline_of_a_collective_held_back, *utf::precondition(ct::nccl_usable) * utf::timeout(60)) {
  corodist::event_loop loop;
  loop.start();
  auto pg = one_rank_group(loop, "deadline/1");
  const int dev = pg->cuda_device();
  auto buf = ct::to_device(dev, cc::dtype::float32, std::vector<float>(256, 1.0f));
  const auto v = ct::view_of(buf, cc::dtype::float32, 256);
  const auto user = cc::cuda_stream::create(dev);
  {
    ct::stream_gate gate(user);
    cc::call_options co;
    co.stream = user.native();
    co.timeout = 200ms;
    auto late = pg->allreduce(v, cc::reduce_op::sum, co);
    BOOST_CHECK_EXCEPTION(late.wait(20s), cc::collective_timeout_error, [](const cc::collective_timeout_error& e) {
      BOOST_TEST_MESSAGE(e.what());
      return e.op() == "allreduce" && e.seq() == 0u;
    });
    BOOST_TEST(pg->aborted());
    BOOST_CHECK_THROW(pg->allreduce(v).wait(20s), cc::collective_error);
    gate.open();
  }
}

// The deadline with a rank that never joins (world size 2, a GPU each):
// rank 0's allreduce fails with collective_timeout_error; rank 1 aborts its
// group once rank 0 is done.
BOOST_AUTO_TEST_CASE(deadline_when_a_rank_never_joins, *utf::precondition(two_gpus) * utf::timeout(120)) {
  ct::countdown rank0_done(1);
  corodist::test::thread_ranks job;
  auto errors = job.run(2, [&](int r) {
    corodist::event_loop loop;
    loop.start();
    cc::nccl_options o;
    o.prefix = "deadline/2";
    o.device = r;
    o.timeout = 30s;
    auto pg = cc::nccl_group::create_sync(loop.get_executor(), job.store, r, 2, o);
    if (r == 1) {
      RANK_REQUIRE(rank0_done.wait_for(90s));
      pg->abort("rank 1 leaves");
      return;
    }
    arrive_on_exit guard{rank0_done};
    auto buf = ct::to_device(r, cc::dtype::float32, std::vector<float>(1024, 1.0f));
    auto w = pg->allreduce(ct::view_of(buf, cc::dtype::float32, 1024), cc::reduce_op::sum, within(1s));
    const auto what = timeout_of(w, "allreduce alone");
    RANK_REQUIRE(what.find("allreduce") != std::string::npos);
    RANK_REQUIRE(pg->aborted());
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

// shrink's argument checks, on a group of one rank (which cannot shrink: any
// rank given is out of range or itself); whether shrink can run follows the
// NCCL version, before and after an abort.
BOOST_AUTO_TEST_CASE(shrink_rejects_bad_ranks, *utf::precondition(ct::nccl_usable) * utf::timeout(60)) {
  corodist::event_loop loop;
  loop.start();
  auto pg = one_rank_group(loop, "shrink/usage");
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

#if CORODIST_TEST_CUDA
// ---- point-to-point, all-to-all, rooted collectives, allgatherv, monitored_barrier, split ----

// recv from any_source is refused at the call (ncclRecv names its peer),
// and nothing is issued: the group is not aborted and keeps its numbers.
BOOST_AUTO_TEST_CASE(recv_from_any_source_is_refused, *utf::precondition(ct::nccl_usable) * utf::timeout(60)) {
  corodist::event_loop loop;
  loop.start();
  auto pg = one_rank_group(loop, "p2p/any");
  device_floats buf(pg->cuda_device(), std::vector<float>(16, 1.0f));
  BOOST_CHECK_EXCEPTION((void)pg->recv(buf.view, cc::any_source), corodist::usage_error,
                        [](const corodist::usage_error& e) {
                          BOOST_TEST_MESSAGE(e.what());
                          const std::string w = e.what();
                          return w.find("any rank") != std::string::npos && w.find("gloo") != std::string::npos;
                        });
  BOOST_TEST(!pg->aborted());
  BOOST_TEST(pg->sequence_number() == 0u);
  pg->allreduce(buf.view).get(); // still usable
  BOOST_TEST(pg->sequence_number() == 1u);
}

// send/recv between pairs (even ranks send first, odd ranks receive first),
// then a batch_isend_irecv ring (each rank lists its entries in its own
// order): every value checked against what the peer sent; receives say
// their source; point-to-point calls have their own numbers and leave
// sequence_number() alone.
BOOST_AUTO_TEST_CASE(send_recv_and_batch_between_gpus, *utf::precondition(two_gpus) * utf::timeout(240)) {
  const int n = gpu_count(4);
  ct::thread_ranks job;
  auto errors = job.run(n, [&](int r) {
    corodist::event_loop loop;
    loop.start();
    auto pg = rank_group(loop, job, r, n, "p2p/pairs");
    const std::size_t c = 4099;
    // Pairs (0,1), (2,3), ...: a rank without a partner (odd n) sits out.
    const int partner = r % 2 == 0 ? r + 1 : r - 1;
    std::uint64_t p2p_calls = 0;
    if (partner < n) {
      device_floats mine(r, a2a_block(r, partner, c));
      device_floats got(r, std::vector<float>(c, -1.0f));
      cc::work sent, received;
      if (r % 2 == 0) {
        sent = pg->send(mine.view, partner, 7);
        received = pg->recv(got.view, partner, 7);
      } else {
        received = pg->recv(got.view, partner, 7);
        sent = pg->send(mine.view, partner, 7);
      }
      sent.get();
      received.get();
      ct::require_equal(got.host(), a2a_block(partner, r, c), "recv from the partner");
      RANK_REQUIRE(received.source_rank() == partner);
      RANK_REQUIRE(sent.source_rank() == -1);
      RANK_REQUIRE(sent.seq() + received.seq() == 1u); // numbered 0 and 1 among point-to-point calls
      p2p_calls = 2;
    }
    RANK_REQUIRE(pg->sequence_number() == 0u);
    // A ring in one batch: to r+1, from r-1; odd ranks list the receive first.
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    device_floats out(r, a2a_block(r, next, c));
    device_floats in(r, std::vector<float>(c, -1.0f));
    std::vector<cc::p2p_op> ops{cc::p2p_op::isend(out.view, next), cc::p2p_op::irecv(in.view, prev)};
    if (r % 2 == 1)
      std::swap(ops[0], ops[1]);
    auto ring = pg->batch_isend_irecv(ops);
    RANK_REQUIRE(ring.seq() == p2p_calls);
    ring.get();
    ct::require_equal(in.host(), a2a_block(prev, r, c), "batch_isend_irecv ring");
    RANK_REQUIRE(pg->sequence_number() == 0u);
    // A collective after them: numbered 0.
    auto w = pg->barrier();
    RANK_REQUIRE(w.seq() == 0u);
    w.get();
    RANK_REQUIRE(pg->sequence_number() == 1u);
    RANK_REQUIRE(!pg->aborted());
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

// A send whose peer posts no receive fails at its deadline with
// collective_timeout_error naming both ranks, and aborts the group; the
// peer leaves once the sender is done.
BOOST_AUTO_TEST_CASE(unmatched_send_times_out_naming_both_ranks, *utf::precondition(two_gpus) * utf::timeout(120)) {
  ct::countdown rank0_done(1);
  ct::thread_ranks job;
  auto errors = job.run(2, [&](int r) {
    corodist::event_loop loop;
    loop.start();
    auto pg = rank_group(loop, job, r, 2, "p2p/unmatched");
    if (r == 1) {
      RANK_REQUIRE(rank0_done.wait_for(90s));
      pg->abort("rank 1 leaves");
      return;
    }
    arrive_on_exit guard{rank0_done};
    device_floats buf(r, std::vector<float>(1024, 1.0f));
    auto w = pg->send(buf.view, 1, 0, within(1s));
    const auto what = timeout_of(w, "unmatched send");
    RANK_REQUIRE(what.find("rank 0") != std::string::npos);
    RANK_REQUIRE(what.find("rank 1") != std::string::npos);
    RANK_REQUIRE(what.find("send") != std::string::npos);
    RANK_REQUIRE(pg->aborted());
    ct::require_throws<cc::collective_error>([&] { pg->barrier().wait(20s); }, "a barrier after the abort");
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

// all_to_all_single (even and uneven splits), all_to_all over lists,
// gather and scatter (root n-1), reduce (root 0; sum, min, max, product,
// and avg where n is a power of two), allgatherv (one rank contributing
// nothing) and monitored_barrier, at every world size from 1 to the device
// count (at most 4), on float32 device buffers; every value checked against
// the host's.
BOOST_AUTO_TEST_CASE(new_collectives_at_every_world_size, *utf::precondition(ct::nccl_usable) * utf::timeout(300)) {
  const int devices = gpu_count(4);
  for (int n = 1; n <= devices; ++n) {
    BOOST_TEST_MESSAGE("world size " << n);
    ct::thread_ranks job;
    auto errors = job.run(n, [&](int r) {
      corodist::event_loop loop;
      loop.start();
      auto pg = rank_group(loop, job, r, n, "new/" + std::to_string(n));
      const auto ns = static_cast<std::size_t>(n);
      std::uint64_t issued = 0;
      const std::string at = " at world size " + std::to_string(n);
      // all_to_all_single, even: blocks of c.
      {
        const std::size_t c = 1001;
        std::vector<float> in, want;
        for (int j = 0; j < n; ++j) {
          append(in, a2a_block(r, j, c));
          append(want, a2a_block(j, r, c));
        }
        device_floats din(r, in), dout(r, std::vector<float>(ns * c, -1.0f));
        pg->all_to_all_single(din.view, dout.view).get();
        ct::require_equal(dout.host(), want, "all_to_all_single even" + at);
        ++issued;
      }
      // all_to_all_single, uneven; and all_to_all over lists of the same blocks.
      {
        std::vector<std::size_t> in_splits, out_splits;
        std::vector<float> in, want;
        for (int j = 0; j < n; ++j) {
          in_splits.push_back(uneven_count(r, j));
          out_splits.push_back(uneven_count(j, r));
          append(in, a2a_block(r, j, uneven_count(r, j)));
          append(want, a2a_block(j, r, uneven_count(j, r)));
        }
        device_floats din(r, in), dout(r, std::vector<float>(want.size(), -1.0f));
        pg->all_to_all_single(din.view, dout.view, in_splits, out_splits).get();
        ct::require_equal(dout.host(), want, "all_to_all_single uneven" + at);
        std::vector<std::unique_ptr<device_floats>> ins, outs;
        std::vector<cc::tensor_view> in_views, out_views;
        for (int j = 0; j < n; ++j) {
          ins.push_back(std::make_unique<device_floats>(r, a2a_block(r, j, uneven_count(r, j))));
          outs.push_back(std::make_unique<device_floats>(r, std::vector<float>(uneven_count(j, r), -1.0f)));
          in_views.push_back(ins.back()->view);
          out_views.push_back(outs.back()->view);
        }
        pg->all_to_all(in_views, out_views).get();
        for (int j = 0; j < n; ++j)
          ct::require_equal(outs[static_cast<std::size_t>(j)]->host(), a2a_block(j, r, uneven_count(j, r)),
                            "all_to_all from rank " + std::to_string(j) + at);
        issued += 2;
      }
      // gather and scatter at root n-1.
      {
        const std::size_t c = 513;
        const int root = n - 1;
        device_floats mine(r, a2a_block(r, root, c));
        device_floats whole(r, r == root ? std::vector<float>(ns * c, -1.0f) : std::vector<float>{});
        pg->gather(mine.view, whole.view, root).get();
        if (r == root) {
          std::vector<float> want;
          for (int j = 0; j < n; ++j)
            append(want, a2a_block(j, root, c));
          ct::require_equal(whole.host(), want, "gather" + at);
        }
        std::vector<float> blocks;
        for (int j = 0; j < n; ++j)
          append(blocks, a2a_block(root, j, c));
        device_floats src(r, r == root ? blocks : std::vector<float>{});
        device_floats part(r, std::vector<float>(c, -1.0f));
        pg->scatter(src.view, part.view, root).get();
        ct::require_equal(part.host(), a2a_block(root, r, c), "scatter" + at);
        issued += 2;
      }
      // reduce to rank 0 with every op.
      {
        const std::size_t c = 777;
        auto value = [](int q, std::size_t k) { return static_cast<float>(1 + (q + static_cast<int>(k)) % 2); };
        std::vector<cc::reduce_op> ops{cc::reduce_op::sum, cc::reduce_op::min, cc::reduce_op::max,
                                       cc::reduce_op::product};
        if ((n & (n - 1)) == 0)
          ops.push_back(cc::reduce_op::avg);
        for (auto op : ops) {
          std::vector<float> mine(c), want(c);
          for (std::size_t k = 0; k < c; ++k) {
            mine[k] = value(r, k);
            float acc = value(0, k);
            for (int q = 1; q < n; ++q) {
              const float x = value(q, k);
              switch (op) {
              case cc::reduce_op::sum:
              case cc::reduce_op::avg: acc += x; break;
              case cc::reduce_op::min: acc = std::min(acc, x); break;
              case cc::reduce_op::max: acc = std::max(acc, x); break;
              case cc::reduce_op::product: acc *= x; break;
              }
            }
            want[k] = op == cc::reduce_op::avg ? acc / static_cast<float>(n) : acc;
          }
          device_floats t(r, mine);
          pg->reduce(t.view, 0, op).get();
          if (r == 0)
            ct::require_equal(t.host(), want, std::string("reduce ") + std::string(cc::to_string(op)) + at);
          ++issued;
        }
      }
      // allgatherv: rank j contributes j % 3 * 100 elements (rank 0 none).
      {
        std::vector<std::size_t> counts;
        std::vector<float> want;
        for (int j = 0; j < n; ++j) {
          counts.push_back(static_cast<std::size_t>(j % 3) * 100);
          append(want, a2a_block(j, 0, counts.back()));
        }
        device_floats mine(r, a2a_block(r, 0, counts[static_cast<std::size_t>(r)]));
        device_floats all(r, std::vector<float>(want.size(), -1.0f));
        pg->allgatherv(mine.view, all.view, counts).get();
        ct::require_equal(all.host(), want, "allgatherv" + at);
        ++issued;
      }
      pg->monitored_barrier().get();
      ++issued;
      RANK_REQUIRE(pg->sequence_number() == issued);
      RANK_REQUIRE(!pg->aborted());
    });
    for (auto& e : errors)
      BOOST_TEST(e.empty(), e);
  }
}

// monitored_barrier with the last rank missing: rank 0 and every rank that
// arrived fail at the deadline with collective_timeout_error naming the
// missing rank, and their groups are aborted.
BOOST_AUTO_TEST_CASE(monitored_barrier_names_the_missing_rank, *utf::precondition(two_gpus) * utf::timeout(120)) {
  const int n = gpu_count(3);
  const int missing = n - 1;
  ct::countdown arrived_done(n - 1);
  ct::thread_ranks job;
  auto errors = job.run(n, [&](int r) {
    corodist::event_loop loop;
    loop.start();
    auto pg = rank_group(loop, job, r, n, "monitored/missing");
    if (r == missing) {
      RANK_REQUIRE(arrived_done.wait_for(90s));
      return;
    }
    arrive_on_exit guard{arrived_done};
    auto w = pg->monitored_barrier(within(1s));
    const auto what = timeout_of(w, "monitored_barrier");
    RANK_REQUIRE(what.find("rank " + std::to_string(missing) + " did not reach monitored_barrier") !=
                 std::string::npos);
    RANK_REQUIRE(pg->aborted());
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

// split at world size 1: color 0 makes a group of one (its own numbers,
// stream and device), no_color gets null, a negative color is refused.
BOOST_AUTO_TEST_CASE(split_of_one_rank, *utf::precondition(ct::nccl_usable) * utf::timeout(60)) {
  corodist::event_loop loop;
  loop.start();
  auto pg = one_rank_group(loop, "split/one");
  const auto ex = loop.get_executor();
  auto child = corodist::run_blocking(ex, pg->split(0, 0), "split");
  BOOST_REQUIRE(child);
  BOOST_TEST(child->rank() == 0);
  BOOST_TEST(child->size() == 1);
  BOOST_TEST(child->backend() == "nccl");
  auto nccl_child = std::dynamic_pointer_cast<cc::nccl_group>(child);
  BOOST_REQUIRE(nccl_child);
  BOOST_TEST(nccl_child->cuda_device() == pg->cuda_device());
  BOOST_TEST(nccl_child->stream() != pg->stream());
  device_floats buf(pg->cuda_device(), ct::small_values(0, 100));
  child->allreduce(buf.view).get();
  ct::require_equal(buf.host(), ct::small_values(0, 100), "allreduce on the child");
  child->monitored_barrier().get();
  BOOST_TEST(child->sequence_number() == 2u);
  BOOST_TEST(pg->sequence_number() == 0u);
  BOOST_TEST(!corodist::run_blocking(ex, pg->split(cc::no_color, 0), "split"));
  BOOST_CHECK_THROW(corodist::run_blocking(ex, pg->split(-5, 0), "split"), corodist::usage_error);
  child->abort("the child goes");
  pg->allreduce(buf.view).get(); // the parent is independent of its child
  BOOST_TEST(!pg->aborted());
}

// split over the GPUs: color = rank % 2, key = -rank (so each new group is
// ranked in reverse), the last rank of 3 or more passes no_color. Each new
// group reduces over its members only, and its monitored_barrier works
// through the store under its own prefix.
BOOST_AUTO_TEST_CASE(split_by_color_and_key, *utf::precondition(two_gpus) * utf::timeout(240)) {
  const int n = gpu_count(4);
  ct::thread_ranks job;
  auto errors = job.run(n, [&](int r) {
    corodist::event_loop loop;
    loop.start();
    const auto ex = loop.get_executor();
    auto pg = rank_group(loop, job, r, n, "split/color");
    const bool out = n >= 3 && r == n - 1;
    const int color = out ? cc::no_color : r % 2;
    auto child = corodist::run_blocking(ex, pg->split(color, -r), "split");
    if (out) {
      RANK_REQUIRE(!child);
      pg->barrier().get(); // the parent still works, with every rank
      return;
    }
    RANK_REQUIRE(child);
    std::vector<int> members; // ranks of the parent with this color, by key (-rank): descending
    for (int q = n - 1; q >= 0; --q)
      if (!(n >= 3 && q == n - 1) && q % 2 == color)
        members.push_back(q);
    RANK_REQUIRE(child->size() == static_cast<int>(members.size()));
    RANK_REQUIRE(child->rank() == static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin()));
    float want = 0;
    for (int q : members)
      want += static_cast<float>(q + 1);
    device_floats buf(r, std::vector<float>(64, static_cast<float>(r + 1)));
    child->allreduce(buf.view).get();
    ct::require_equal(buf.host(), std::vector<float>(64, want), "allreduce on the split group");
    child->monitored_barrier().get();
    RANK_REQUIRE(child->sequence_number() == 2u);
    RANK_REQUIRE(pg->sequence_number() == 0u);
    pg->barrier().get(); // the parent still works, with every rank
    RANK_REQUIRE(pg->sequence_number() == 1u);
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}
#endif

BOOST_AUTO_TEST_SUITE_END()
