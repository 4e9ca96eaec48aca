// The DDP reducer on CUDA gradients: two ranks (threads) on one GPU through
// gloo_group's staging, compared bit for bit with the host reducer on the same
// data; NCCL at world size 1; and, without a GPU, the error a CUDA parameter gets.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/cuda_stream.hpp>
#include <corodist/collective/device_buffer.hpp>
#include <corodist/collective/errors.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/collective/nccl_group.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/ddp/default_hooks.hpp>
#include <corodist/ddp/reducer.hpp>
#include <corodist/store/hash_store.hpp>

#include "collective/cuda_fixtures.hpp"
#include "collective/gloo_fixtures.hpp"
#include "ddp/reducer_fixtures.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cc = corodist::collective;
namespace ct = corodist::test;
namespace dd = corodist::ddp;
using corodist::test::reducer_fixtures::grad_value;
using corodist::test::reducer_fixtures::mean_grad;

namespace {

const std::vector<std::size_t> sizes = {300, 7, 1000, 64, 129, 5, 800, 33};

// An inexact gradient value (rounding in the sum matters: bit equality with
// the host reducer then says the same operations ran in the same order).
float wavy(int r, int it, std::size_t k, std::size_t j) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(j) + static_cast<double>(k) + 1.3 * r + 0.7 * it));
}

std::vector<float> wavy_values(int r, int it, std::size_t k, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t j = 0; j < n; ++j)
    v[j] = wavy(r, it, k, j);
  return v;
}

std::vector<float> exact_values(int r, int it, std::size_t k, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t j = 0; j < n; ++j)
    v[j] = static_cast<float>(grad_value(r, it, k, j));
  return v;
}

// A model of float32 parameters in the memory of `where` (device memory, or host vectors).
struct device_model {
  device_model(std::vector<std::size_t> s, cc::device where, int rank) : sizes(std::move(s)), at(where) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const std::vector<float> init(sizes[k], static_cast<float>(rank + 1));
      if (at.kind == cc::device::kind_type::cuda) {
        values.push_back(ct::to_device(at.index, cc::dtype::float32, init));
        grads.push_back(ct::to_device(at.index, cc::dtype::float32, std::vector<float>(sizes[k], 0.0f)));
      } else {
        host_values.push_back(init);
        host_grads.emplace_back(sizes[k], 0.0f);
      }
    }
  }
  std::vector<dd::parameter> parameters(bool with_grads = true) {
    std::vector<dd::parameter> ps;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const bool cuda = at.kind == cc::device::kind_type::cuda;
      void* v = cuda ? values[k].data() : host_values[k].data();
      void* g = !with_grads ? nullptr : cuda ? grads[k].data() : host_grads[k].data();
      ps.emplace_back(v, g, sizes[k], cc::dtype::float32, at, fmt::format("p{}", k));
    }
    return ps;
  }
  std::vector<float> value(std::size_t k) {
    if (at.kind == cc::device::kind_type::cuda)
      return ct::from_device(ct::view_of(values[k], cc::dtype::float32, sizes[k]));
    return host_values[k];
  }
  std::vector<std::size_t> sizes;
  cc::device at;
  std::vector<cc::device_buffer> values, grads;
  std::vector<std::vector<float>> host_values, host_grads;
};

// Writes `v` into gradient k of `red` (device memory: a copy on `stream`, or
// on the legacy default stream when null; host memory: memcpy).
void write_grad(dd::reducer& red, std::size_t k, const std::vector<float>& v, void* stream = nullptr) {
  const auto g = red.gradient(k);
  if (g.count() != v.size())
    throw std::runtime_error(fmt::format("gradient {} has {} elements, want {}", k, g.count(), v.size()));
  if (g.where().kind == cc::device::kind_type::cuda)
    cc::cuda_stream::borrow(g.where().index, stream).copy(g.data(), v.data(), v.size() * sizeof(float));
  else
    std::memcpy(g.data(), v.data(), v.size() * sizeof(float));
}

// Gradient k of `red` on the host (device memory: copied on the legacy
// default stream, which the reducer's results are ordered before).
std::vector<float> read_grad(dd::reducer& red, std::size_t k) {
  const auto g = red.gradient(k);
  if (g.where().kind == cc::device::kind_type::cuda)
    return ct::from_device(g);
  const auto* p = static_cast<const float*>(g.data());
  return {p, p + g.count()};
}

// Throws unless `got` and `want` have the same bits.
void require_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  RANK_REQUIRE(got.size() == want.size());
  for (std::size_t j = 0; j < got.size(); ++j)
    if (std::bit_cast<std::uint32_t>(got[j]) != std::bit_cast<std::uint32_t>(want[j]))
      throw std::runtime_error(fmt::format("{}: element {}: {} != {} (bits {:08x} != {:08x})", what, j, got[j], want[j],
                                           std::bit_cast<std::uint32_t>(got[j]), std::bit_cast<std::uint32_t>(want[j])));
}

// One synchronised iteration of `red`: gradients `grad(k)` written and marked
// in `order`, then finalize.
template <typename G>
void iteration(dd::reducer& red, const std::vector<std::size_t>& order, G&& grad, void* stream = nullptr) {
  red.prepare_for_backward();
  for (auto k : order) {
    write_grad(red, k, grad(k), stream);
    red.mark_grad_ready(k);
  }
  red.finalize_sync();
}

std::vector<std::size_t> reverse_order(std::size_t n) {
  std::vector<std::size_t> o(n);
  for (std::size_t k = 0; k < n; ++k)
    o[k] = n - 1 - k;
  return o;
}

} // namespace

BOOST_AUTO_TEST_SUITE(reducer_cuda)

// Without a GPU: a parameter on cuda:0 is refused at construction with
// usage_error naming it and saying why CUDA cannot be used.
BOOST_AUTO_TEST_CASE(cuda_parameter_without_cuda_is_refused, *utf::precondition(ct::gloo_without_cuda) *
                                                               utf::timeout(60)) {
  std::string why = cc::cuda_stream::unavailable_reason();
  const std::string prefix = "CUDA cannot be used: ";
  if (why.rfind(prefix, 0) == 0)
    why = why.substr(prefix.size());
  ct::thread_ranks job;
  auto errors = job.run(1, [&](int r) {
    auto pg = job.group(r, 1, ct::gloo_test_options("reducer_cuda/none"));
    alignas(16) static float fake_values[8], fake_grads[8]; // never touched: refused first
    std::vector<float> hv(4), hg(4);
    std::vector<dd::parameter> ps = {dd::parameter(std::span<float>(hv), std::span<float>(hg), "host"),
                                     dd::parameter(fake_values, fake_grads, 8, cc::dtype::float32,
                                                   cc::device::cuda(0), "on_gpu")};
    const auto msg = ct::require_throws<corodist::usage_error>([&] { dd::reducer red(pg, ps); }, "cuda parameter");
    BOOST_TEST_MESSAGE(msg);
    RANK_REQUIRE(msg.find("cuda:0") != std::string::npos);
    RANK_REQUIRE(msg.find("parameter 1") != std::string::npos);
    RANK_REQUIRE(msg.find(why) != std::string::npos);
  });
  BOOST_TEST(errors[0] == "", errors[0]);
}

#if CORODIST_TEST_CUDA
// Two ranks on GPU 0 through the staged Gloo group, both ways of
// gradient_as_bucket_view, three iterations with random ready orders and a
// bucket rebuild: values broadcast from rank 0; the buckets on cuda:0; the
// averaged gradients bit for bit those of the host reducer on the same data.
BOOST_AUTO_TEST_CASE(staged_gloo_averages_like_the_host_reducer, *utf::precondition(ct::gloo_and_cuda) *
                                                                   utf::timeout(240)) {
  ct::thread_ranks job;
  auto errors = job.run(2, [&](int r) {
    auto pg = job.group(r, 2, ct::gloo_test_options("reducer_cuda/avg"));
    for (bool view : {false, true}) {
      device_model gpu(sizes, cc::device::cuda(0), r);
      device_model cpu(sizes, cc::device::cpu(), r);
      dd::reducer_options o;
      o.bucket_cap_bytes = 2048;
      o.first_bucket_bytes = 512;
      o.gradient_as_bucket_view = view;
      dd::reducer red(pg, gpu.parameters(!view), o);
      dd::reducer host(pg, cpu.parameters(!view), o);
      for (std::size_t k = 0; k < sizes.size(); ++k)
        ct::require_equal(gpu.value(k), std::vector<float>(sizes[k], 1.0f), "values broadcast from rank 0");
      for (const auto& b : red.layout().buckets)
        RANK_REQUIRE(b.where == cc::device::cuda(0));
      std::mt19937 rng(static_cast<unsigned>(r * 31 + 7));
      for (int it = 0; it < 3; ++it) {
        std::vector<std::size_t> order(sizes.size());
        for (std::size_t k = 0; k < order.size(); ++k)
          order[k] = k;
        std::shuffle(order.begin(), order.end(), rng);
        auto grad = [&](std::size_t k) { return wavy_values(r, it, k, sizes[k]); };
        iteration(red, order, grad);
        iteration(host, order, grad);
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          const auto got = read_grad(red, k);
          require_same_bits(got, read_grad(host, k), fmt::format("view={} iteration {} parameter {}", view, it, k));
          RANK_REQUIRE((red.gradient(k).data() == gpu.grads[k].data()) == !view);
          RANK_REQUIRE(red.gradient(k).where() == cc::device::cuda(0));
          for (std::size_t j = 0; j < got.size(); j += 97) // and it is the mean
            RANK_REQUIRE(std::abs(got[j] - (wavy(0, it, k, j) + wavy(1, it, k, j)) / 2) <= 1e-6f);
        }
        RANK_REQUIRE(red.last_stats().synchronized);
      }
      RANK_REQUIRE(red.rebuilt() == host.rebuilt());
    }
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

// find_unused_parameters (rank 0 uses all but 2, rank 1 neither 2 nor 3: 2
// is globally unused and its device gradient untouched, 3 averaged with
// rank 1's zero), then no_sync: two local iterations accumulate and the
// third reduces the sum; exact values (multiples of 1/8).
BOOST_AUTO_TEST_CASE(staged_gloo_unused_parameters_and_no_sync, *utf::precondition(ct::gloo_and_cuda) *
                                                                  utf::timeout(240)) {
  ct::thread_ranks job;
  auto errors = job.run(2, [&](int r) {
    auto pg = job.group(r, 2, ct::gloo_test_options("reducer_cuda/unused"));
    {
      const std::vector<std::size_t> small = {10, 20, 30, 40, 50};
      device_model m(small, cc::device::cuda(0), r);
      dd::reducer_options o;
      o.find_unused_parameters = true;
      o.bucket_cap_bytes = 100;
      o.first_bucket_bytes = 100;
      dd::reducer red(pg, m.parameters(), o);
      for (int it = 0; it < 2; ++it) {
        const std::vector<std::size_t> used =
            r == 0 ? std::vector<std::size_t>{0, 1, 3, 4} : std::vector<std::size_t>{0, 1, 4};
        write_grad(red, 2, std::vector<float>(30, 42.0f)); // must survive
        red.prepare_for_backward(used);
        for (auto k : used) {
          write_grad(red, k, exact_values(r, it, k, small[k]));
          red.mark_grad_ready(k);
        }
        red.finalize_sync();
        RANK_REQUIRE(red.globally_unused() == std::vector<std::size_t>{2});
        ct::require_equal(read_grad(red, 2), std::vector<float>(30, 42.0f), "globally unused gradient");
        for (std::size_t k : {0, 1, 4}) {
          std::vector<float> want(small[k]);
          for (std::size_t j = 0; j < want.size(); ++j)
            want[j] = static_cast<float>(mean_grad(2, it, k, j));
          ct::require_equal(read_grad(red, k), want, fmt::format("iteration {} parameter {}", it, k));
        }
        std::vector<float> want3(40);
        for (std::size_t j = 0; j < want3.size(); ++j)
          want3[j] = static_cast<float>(grad_value(0, it, 3, j) / 2);
        ct::require_equal(read_grad(red, 3), want3, fmt::format("iteration {} parameter 3", it));
      }
    }
    {
      device_model m(sizes, cc::device::cuda(0), r);
      dd::reducer red(pg, m.parameters());
      std::vector<std::vector<float>> acc(sizes.size());
      for (std::size_t k = 0; k < sizes.size(); ++k)
        acc[k].assign(sizes[k], 0.0f);
      auto step = [&](int it) {
        iteration(red, reverse_order(sizes.size()), [&](std::size_t k) {
          const auto g = exact_values(r, it, k, sizes[k]);
          for (std::size_t j = 0; j < sizes[k]; ++j)
            acc[k][j] += g[j]; // accumulated, as autograd does
          return acc[k];
        });
      };
      const auto seq0 = pg->sequence_number();
      {
        auto guard = red.no_sync();
        step(0);
        step(1);
        RANK_REQUIRE(!red.last_stats().synchronized);
      }
      RANK_REQUIRE(pg->sequence_number() == seq0);
      step(2);
      RANK_REQUIRE(red.last_stats().synchronized);
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        std::vector<float> want(sizes[k]);
        for (std::size_t j = 0; j < sizes[k]; ++j)
          want[j] = static_cast<float>(mean_grad(2, 0, k, j) + mean_grad(2, 1, k, j) + mean_grad(2, 2, k, j));
        ct::require_equal(read_grad(red, k), want, fmt::format("no_sync parameter {}", k));
      }
    }
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

// The fp16 compression hook on device (the convert kernel, a float16
// allreduce): bit for bit the host reducer's fp16 results, within float16
// precision of the mean, and really compressed.
BOOST_AUTO_TEST_CASE(staged_gloo_fp16_hook_equals_the_host, *utf::precondition(ct::gloo_and_cuda) * utf::timeout(240)) {
  ct::thread_ranks job;
  auto errors = job.run(2, [&](int r) {
    auto pg = job.group(r, 2, ct::gloo_test_options("reducer_cuda/fp16"));
    const std::vector<std::size_t> big = {1000, 3000};
    device_model gpu(big, cc::device::cuda(0), r);
    device_model cpu(big, cc::device::cpu(), r);
    dd::reducer red(pg, gpu.parameters());
    dd::reducer host(pg, cpu.parameters());
    red.register_comm_hook(dd::hooks::fp16_compress());
    host.register_comm_hook(dd::hooks::fp16_compress());
    auto grad = [&](std::size_t k) { return wavy_values(r, 0, k, big[k]); };
    iteration(red, reverse_order(2), grad);
    iteration(host, reverse_order(2), grad);
    std::size_t inexact = 0;
    for (std::size_t k = 0; k < 2; ++k) {
      const auto got = read_grad(red, k);
      require_same_bits(got, read_grad(host, k), fmt::format("fp16 parameter {}", k));
      for (std::size_t j = 0; j < got.size(); ++j) {
        const float want = (wavy(0, 0, k, j) + wavy(1, 0, k, j)) / 2;
        RANK_REQUIRE(std::abs(got[j] - want) <= 2e-3f * std::max(1.0f, std::abs(want)));
        inexact += got[j] != want;
      }
    }
    RANK_REQUIRE(inexact > 100);
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

// One model with host and CUDA parameters: one bucket set per device (every
// bucket's parameters live where the bucket does, and both kinds exist);
// every gradient averaged exactly.
BOOST_AUTO_TEST_CASE(mixed_cpu_and_cuda_parameters, *utf::precondition(ct::gloo_and_cuda) * utf::timeout(240)) {
  ct::thread_ranks job;
  auto errors = job.run(2, [&](int r) {
    auto pg = job.group(r, 2, ct::gloo_test_options("reducer_cuda/mixed"));
    device_model gpu(sizes, cc::device::cuda(0), r);
    device_model cpu({70, 300, 9}, cc::device::cpu(), r);
    auto ps = gpu.parameters();
    for (auto& p : cpu.parameters())
      ps.push_back(p);
    std::vector<std::size_t> all_sizes = sizes;
    all_sizes.insert(all_sizes.end(), {70, 300, 9});
    dd::reducer_options o;
    o.bucket_cap_bytes = 1024;
    o.first_bucket_bytes = 256;
    dd::reducer red(pg, ps, o);
    bool saw_cpu = false, saw_cuda = false;
    for (const auto& b : red.layout().buckets) {
      for (auto p : b.parameters)
        RANK_REQUIRE(ps[p].where == b.where);
      saw_cpu |= b.where == cc::device::cpu();
      saw_cuda |= b.where == cc::device::cuda(0);
    }
    RANK_REQUIRE(saw_cpu && saw_cuda);
    for (int it = 0; it < 2; ++it) {
      iteration(red, reverse_order(ps.size()), [&](std::size_t k) { return exact_values(r, it, k, all_sizes[k]); });
      for (std::size_t k = 0; k < ps.size(); ++k) {
        std::vector<float> want(all_sizes[k]);
        for (std::size_t j = 0; j < want.size(); ++j)
          want[j] = static_cast<float>(mean_grad(2, it, k, j));
        ct::require_equal(read_grad(red, k), want, fmt::format("iteration {} parameter {}", it, k));
      }
    }
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

// reducer_options::stream: the gradients are produced on the caller's stream
// (held by a gate until every gradient was marked): the bucket copies wait
// for that stream, and the results are ordered before the work queued on it
// after finalize (read back there).
BOOST_AUTO_TEST_CASE(reducer_stream_orders_the_copies, *utf::precondition(ct::gloo_and_cuda) * utf::timeout(240)) {
  ct::thread_ranks job;
  auto errors = job.run(2, [&](int r) {
    auto pg = job.group(r, 2, ct::gloo_test_options("reducer_cuda/stream"));
    const auto user = cc::cuda_stream::create(0);
    device_model m(sizes, cc::device::cuda(0), r);
    dd::reducer_options o;
    o.stream = user.native();
    o.bucket_cap_bytes = 2048;
    o.first_bucket_bytes = 512;
    dd::reducer red(pg, m.parameters(), o);
    std::vector<cc::device_buffer> pinned;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      pinned.push_back(cc::device_buffer::allocate(cc::device::cpu(), sizes[k] * sizeof(float)));
      const auto g = exact_values(r, 0, k, sizes[k]);
      std::memcpy(pinned.back().data(), g.data(), g.size() * sizeof(float));
    }
    bool expired = false;
    {
      ct::stream_gate gate(user);
      red.prepare_for_backward();
      for (std::size_t k = sizes.size(); k-- > 0;) {
        user.copy(red.gradient(k).data(), pinned[k].data(), sizes[k] * sizeof(float));
        red.mark_grad_ready(k);
      }
      gate.open();
      red.finalize_sync();
      expired = gate.expired();
    }
    RANK_REQUIRE(!expired);
    auto out = cc::device_buffer::allocate(cc::device::cpu(), 1000 * sizeof(float));
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      user.copy(out.data(), red.gradient(k).data(), sizes[k] * sizeof(float)); // after finalize, on the stream
      user.synchronize();
      const auto* p = static_cast<const float*>(out.data());
      std::vector<float> want(sizes[k]);
      for (std::size_t j = 0; j < want.size(); ++j)
        want[j] = static_cast<float>(mean_grad(2, 0, k, j));
      ct::require_equal(std::vector<float>(p, p + sizes[k]), want, fmt::format("parameter {}", k));
    }
  });
  for (auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

// NCCL at world size 1: the averaged gradient is the gradient, bit for bit,
// both ways of gradient_as_bucket_view; the buckets live on the group's
// device; the fp16 hook gives each value rounded through float16.
BOOST_AUTO_TEST_CASE(nccl_world_size_1, *utf::precondition(ct::nccl_usable) * utf::timeout(120)) {
  corodist::event_loop loop;
  loop.start();
  auto store = std::make_shared<corodist::store::hash_store>(loop.get_executor());
  cc::nccl_options no;
  no.prefix = "reducer_cuda/nccl";
  no.timeout = 60s;
  std::shared_ptr<cc::process_group> pg = cc::nccl_group::create_sync(loop.get_executor(), store, 0, 1, no);
  const auto dev = pg->control_device();
  for (bool view : {false, true}) {
    device_model m(sizes, dev, 0);
    dd::reducer_options o;
    o.gradient_as_bucket_view = view;
    o.bucket_cap_bytes = 2048;
    o.first_bucket_bytes = 512;
    dd::reducer red(pg, m.parameters(!view), o);
    for (const auto& b : red.layout().buckets)
      BOOST_TEST((b.where == dev));
    for (int it = 0; it < 2; ++it) {
      iteration(red, reverse_order(sizes.size()), [&](std::size_t k) { return wavy_values(0, it, k, sizes[k]); });
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        BOOST_TEST(((red.gradient(k).data() == m.grads[k].data()) == !view));
        const auto got = read_grad(red, k);
        const auto want = wavy_values(0, it, k, sizes[k]);
        BOOST_TEST(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0,
                   "view=" << view << " iteration " << it << " parameter " << k << ": "
                           << ct::first_difference(got, want));
      }
    }
  }
  device_model m({1000, 3000}, dev, 0);
  dd::reducer red(pg, m.parameters());
  red.register_comm_hook(dd::hooks::fp16_compress());
  iteration(red, reverse_order(2), [&](std::size_t k) { return wavy_values(0, 0, k, k == 0 ? 1000 : 3000); });
  for (std::size_t k = 0; k < 2; ++k) {
    auto want = wavy_values(0, 0, k, k == 0 ? 1000 : 3000);
    for (auto& x : want)
      x = cc::float16::to_float(cc::float16::from_float(x));
    const auto got = read_grad(red, k);
    BOOST_TEST(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0,
               "fp16 parameter " << k << ": " << ct::first_difference(got, want));
  }
}
#endif

BOOST_AUTO_TEST_SUITE_END()
