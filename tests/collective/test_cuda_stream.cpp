// cuda_stream, cuda_event and device_buffer: what a machine without a GPU is
// told, and, with a GPU, copies, event ordering, awaiting an event, and the
// dtype-converting kernel bit for bit against the host's conversions.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/cuda_event.hpp>
#include <corodist/collective/cuda_stream.hpp>
#include <corodist/collective/device_buffer.hpp>
#include <corodist/collective/errors.hpp>
#include <corodist/collective/float16.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>

#include "collective/cuda_fixtures.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cc = corodist::collective;
using corodist::test::cuda_usable;

namespace {

// Throws unless f() throws a cuda_error whose what() contains `reason`.
template <typename F>
void require_cuda_error(F&& f, const std::string& reason, const char* what) {
  try {
    f();
  } catch (const cc::cuda_error& e) {
    BOOST_TEST_MESSAGE(what << ": " << e.what());
    BOOST_TEST(std::string(e.what()).find(reason) != std::string::npos,
               what << ": the error does not carry the reason: " << e.what());
    return;
  }
  BOOST_ERROR(what << ": did not throw cuda_error");
}

// Values whose float16 / bfloat16 roundings matter: ties, subnormals, the
// overflow edge, float32 subnormals; then random finite float32 bit patterns.
std::vector<float> conversion_inputs() {
  const float s = std::ldexp(1.0f, -24); // the smallest float16 subnormal
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 0.1f, 1.0f / 3, 3.0f, 6.0f, 7.0f,
                          65504.0f, 65519.0f, 65520.0f, 1e6f, -1e6f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::ldexp(1.0f, -14), s, s / 2, 3 * s / 2, 5 * s / 2, -3 * s / 2, s / 4, 1e-8f,
                          1.0f + std::ldexp(1.0f, -11), 1.0f + 3 * std::ldexp(1.0f, -11), 2049.0f, 2051.0f,
                          1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8), 257.0f, 259.0f,
                          std::numeric_limits<float>::denorm_min(), 1e-40f, -1e-40f,
                          std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::lowest()};
  for (int i = 0; i < 2000; ++i)
    v.push_back(static_cast<float>(i) * 0.0137f - 13.0f);
  std::mt19937 rng(12345);
  while (v.size() < 12000) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    if (!std::isnan(f))
      v.push_back(f);
  }
  return v;
}

// Copies `n` elements of `type` at device `src` to the host, as raw 16- or 32-bit words.
template <typename W>
std::vector<W> words_of(const cc::device_buffer& src, std::size_t n) {
  std::vector<W> out(n);
  const auto s = cc::cuda_stream::borrow(src.where().index, nullptr);
  s.copy(out.data(), src.data(), n * sizeof(W));
  s.synchronize();
  return out;
}

// Compares words, naming the first difference with its input.
template <typename W>
void check_words(const std::vector<W>& got, const std::vector<W>& want, const std::vector<float>& in,
                 const std::string& what) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && wrong++ < 5)
      BOOST_ERROR(what << ": element " << i << " (input " << in[i] << ", bits 0x" << std::hex
                       << std::bit_cast<std::uint32_t>(in[i]) << "): device 0x" << static_cast<std::uint32_t>(got[i])
                       << ", host 0x" << static_cast<std::uint32_t>(want[i]) << std::dec);
  BOOST_TEST(wrong == 0u, what << ": " << wrong << " of " << got.size() << " elements differ");
}

} // namespace

BOOST_AUTO_TEST_SUITE(cuda_stream)

// Without a usable GPU: the reason says why, device_count() is 0, and every
// call that needs CUDA throws cuda_error carrying that reason.
BOOST_AUTO_TEST_CASE(without_cuda_every_call_says_why, *utf::precondition(corodist::test::cuda_unusable) *
                                                         utf::timeout(30)) {
  const auto reason = cc::cuda_stream::unavailable_reason();
  BOOST_TEST_MESSAGE("unavailable_reason: " << reason);
  BOOST_TEST(!reason.empty());
  BOOST_TEST(reason.find("CUDA") != std::string::npos, reason);
  BOOST_TEST(cc::cuda_stream::device_count() == 0);
  require_cuda_error([] { (void)cc::cuda_stream::create(0); }, reason, "cuda_stream::create(0)");
  require_cuda_error([] { (void)cc::cuda_stream::borrow(0, nullptr); }, reason, "cuda_stream::borrow(0, null)");
  require_cuda_error([] { (void)cc::cuda_event::create(0); }, reason, "cuda_event::create(0)");
  require_cuda_error([] { (void)cc::device_buffer::allocate(cc::device::cuda(0), 16); }, reason,
                     "device_buffer::allocate(cuda:0, 16)");
  require_cuda_error([] { (void)cc::device_buffer::allocate(cc::device::cpu(), 16); }, reason,
                     "device_buffer::allocate(cpu, 16) (pinned)");
  // What needs no CUDA still works: an empty event is ready and waits for nothing.
  const cc::cuda_event empty;
  BOOST_TEST(!empty.valid());
  BOOST_TEST(empty.ready());
  BOOST_TEST(empty.device() == -1);
  BOOST_TEST(empty.native() == nullptr);
  cc::device_buffer none;
  BOOST_TEST(none.data() == nullptr);
  BOOST_TEST(none.bytes() == 0u);
}

#if CORODIST_TEST_CUDA
// Host -> device -> host through device memory (plain and stream-ordered)
// and pinned host memory; zero(); pageable host memory too.
BOOST_AUTO_TEST_CASE(copy_round_trip, *utf::precondition(cuda_usable) * utf::timeout(60)) {
  BOOST_TEST(cc::cuda_stream::device_count() >= 1);
  BOOST_CHECK_THROW((void)cc::cuda_stream::create(cc::cuda_stream::device_count()), corodist::usage_error);
  const std::size_t n = (1 << 20) + 3;
  const auto s = cc::cuda_stream::create(0);
  BOOST_TEST(s.device() == 0);
  BOOST_TEST(s.native() != nullptr);
  auto pinned_in = cc::device_buffer::allocate(cc::device::cpu(), n * sizeof(float));
  auto pinned_out = cc::device_buffer::allocate(cc::device::cpu(), n * sizeof(float));
  BOOST_TEST((pinned_in.where() == cc::device::cpu()));
  BOOST_TEST(pinned_in.bytes() == n * sizeof(float));
  auto* in = static_cast<float*>(pinned_in.data());
  for (std::size_t i = 0; i < n; ++i)
    in[i] = static_cast<float>(i % 1000) - 499.5f;
  auto dev = cc::device_buffer::allocate(cc::device::cuda(0), n * sizeof(float));
  BOOST_TEST((dev.where() == cc::device::cuda(0)));
  auto scratch = cc::device_buffer::allocate_async(s, n * sizeof(float));
  BOOST_TEST((scratch.where() == cc::device::cuda(0)));
  s.copy(dev.data(), pinned_in.data(), n * sizeof(float));
  s.copy(scratch.data(), dev.data(), n * sizeof(float)); // device to device
  s.copy(pinned_out.data(), scratch.data(), n * sizeof(float));
  s.synchronize();
  BOOST_TEST(std::memcmp(pinned_out.data(), pinned_in.data(), n * sizeof(float)) == 0);
  // Pageable host memory, and zero().
  std::vector<float> pageable(n, 7.0f);
  s.zero(dev.data(), n * sizeof(float));
  s.copy(pageable.data(), dev.data(), n * sizeof(float));
  s.synchronize();
  BOOST_TEST(corodist::test::first_difference(pageable, std::vector<float>(n, 0.0f)) == "");
  // Moves hand the memory over.
  void* const at = dev.data();
  cc::device_buffer moved = std::move(dev);
  BOOST_TEST(moved.data() == at);
  BOOST_TEST(dev.data() == nullptr);
}

// An event orders another stream's work after it (no host wait): stream 2
// copies what stream 1 wrote, once stream 1 (held by a gate) got there.
// A fresh event is ready; ready() is false while its work is held.
BOOST_AUTO_TEST_CASE(record_wait_ready, *utf::precondition(cuda_usable) * utf::timeout(60)) {
  const std::size_t n = 1 << 16;
  const auto s1 = cc::cuda_stream::create(0);
  const auto s2 = cc::cuda_stream::create(0);
  BOOST_TEST(cc::cuda_event::create(0).ready()); // never recorded
  BOOST_CHECK_THROW(s1.record(cc::cuda_event{}), corodist::usage_error);
  s1.wait(cc::cuda_event{}); // ignored
  std::vector<float> src(n);
  for (std::size_t i = 0; i < n; ++i)
    src[i] = static_cast<float>(i) + 0.5f;
  auto a = corodist::test::to_device(0, cc::dtype::float32, std::vector<float>(n, 0.0f));
  auto pinned_src = cc::device_buffer::allocate(cc::device::cpu(), n * sizeof(float));
  auto pinned_out = cc::device_buffer::allocate(cc::device::cpu(), n * sizeof(float));
  std::memcpy(pinned_src.data(), src.data(), n * sizeof(float));
  std::memset(pinned_out.data(), 0, n * sizeof(float));
  {
    corodist::test::stream_gate gate(s1);
    s1.copy(a.data(), pinned_src.data(), n * sizeof(float));
    const auto e1 = s1.record();
    BOOST_TEST(e1.valid());
    BOOST_TEST(e1.device() == 0);
    s2.wait(e1);
    s2.copy(pinned_out.data(), a.data(), n * sizeof(float));
    const auto e2 = cc::cuda_event::create(0);
    s2.record(e2); // re-recorded in place
    BOOST_TEST(!e1.ready()); // held by the gate
    BOOST_TEST(!e2.ready()); // behind e1
    gate.open();
    e2.synchronize();
    BOOST_TEST(e1.ready());
    BOOST_TEST(e2.ready());
    BOOST_TEST(!gate.expired());
  }
  BOOST_TEST(std::memcmp(pinned_out.data(), src.data(), n * sizeof(float)) == 0,
             "stream 2 did not wait for stream 1's copy");
}

// cuda_event::wait as a coroutine on an event loop: times out while the work
// is held (the work goes on), then completes once it may run; the copy's
// result is then visible on the host.
BOOST_AUTO_TEST_CASE(event_wait_in_a_coroutine, *utf::precondition(cuda_usable) * utf::timeout(60)) {
  corodist::event_loop loop;
  loop.start();
  const std::size_t n = 4096;
  const auto s = cc::cuda_stream::create(0);
  auto dev = corodist::test::to_device(0, cc::dtype::float32, std::vector<float>(n, 3.25f));
  auto pinned = cc::device_buffer::allocate(cc::device::cpu(), n * sizeof(float));
  std::memset(pinned.data(), 0, n * sizeof(float));
  corodist::test::stream_gate gate(s);
  s.copy(pinned.data(), dev.data(), n * sizeof(float));
  const auto e = s.record();
  bool timed_out = false;
  corodist::run_blocking(loop.get_executor(), [&]() -> asio::awaitable<void> {
    try {
      co_await e.wait(50ms);
    } catch (const corodist::timeout_error& err) {
      BOOST_TEST_MESSAGE(err.what());
      timed_out = true;
    }
    gate.open();
    co_await e.wait(30s, 10us, 500us);
  }(), "event wait");
  BOOST_TEST(timed_out, "the wait did not time out while the stream was held");
  BOOST_TEST(e.ready());
  const auto* p = static_cast<const float*>(pinned.data());
  BOOST_TEST(corodist::test::first_difference(std::vector<float>(p, p + n), std::vector<float>(n, 3.25f)) == "");
}

// convert(): float32 -> float16 -> float32 with divisors, float32 ->
// bfloat16, and float32 divided in place by 3: the same bits as the host's
// conversions (float16::from_float of the float32 quotient, ...).
BOOST_AUTO_TEST_CASE(convert_matches_the_host_bit_for_bit, *utf::precondition(cuda_usable) * utf::timeout(60)) {
  const auto in = conversion_inputs();
  const std::size_t n = in.size();
  const auto s = cc::cuda_stream::create(0);
  auto src = corodist::test::to_device(0, cc::dtype::float32, in);
  auto half = cc::device_buffer::allocate(cc::device::cuda(0), n * 2);
  auto back = cc::device_buffer::allocate(cc::device::cuda(0), n * 4);
  auto bf = cc::device_buffer::allocate(cc::device::cuda(0), n * 2);
  const auto f32 = corodist::test::view_of(src, cc::dtype::float32, n);
  const auto f16 = corodist::test::view_of(half, cc::dtype::float16, n);
  const auto out32 = corodist::test::view_of(back, cc::dtype::float32, n);
  const auto b16 = corodist::test::view_of(bf, cc::dtype::bfloat16, n);
  for (int d : {1, 2, 3, 4}) {
    s.convert(f32, f16, d);
    s.synchronize();
    std::vector<std::uint16_t> want_half(n);
    for (std::size_t i = 0; i < n; ++i)
      want_half[i] = cc::float16::from_float(in[i] / static_cast<float>(d));
    check_words(words_of<std::uint16_t>(half, n), want_half, in, "float32 / " + std::to_string(d) + " -> float16");
    for (int d2 : {1, 3}) {
      s.convert(f16, out32, d2);
      s.synchronize();
      std::vector<std::uint32_t> want_back(n);
      for (std::size_t i = 0; i < n; ++i)
        want_back[i] = std::bit_cast<std::uint32_t>(cc::float16::to_float(want_half[i]) / static_cast<float>(d2));
      check_words(words_of<std::uint32_t>(back, n), want_back, in, "float16 / " + std::to_string(d2) + " -> float32");
    }
    s.convert(f32, b16, d);
    s.synchronize();
    std::vector<std::uint16_t> want_bf(n);
    for (std::size_t i = 0; i < n; ++i)
      want_bf[i] = cc::bfloat16::from_float(in[i] / static_cast<float>(d));
    check_words(words_of<std::uint16_t>(bf, n), want_bf, in, "float32 / " + std::to_string(d) + " -> bfloat16");
  }
  // In place, float32 / 3 (divided in float32, as the host's division).
  s.convert(f32, f32, 3);
  s.synchronize();
  std::vector<std::uint32_t> want_third(n);
  for (std::size_t i = 0; i < n; ++i)
    want_third[i] = std::bit_cast<std::uint32_t>(in[i] / 3.0f);
  check_words(words_of<std::uint32_t>(src, n), want_third, in, "float32 / 3 in place");
}

// convert()'s usage errors, at the call.
BOOST_AUTO_TEST_CASE(convert_usage_errors, *utf::precondition(cuda_usable) * utf::timeout(30)) {
  const auto s = cc::cuda_stream::create(0);
  auto buf = cc::device_buffer::allocate(cc::device::cuda(0), 64 * 4);
  const cc::tensor_view f32(buf.data(), 64, cc::dtype::float32, cc::device::cuda(0));
  const cc::tensor_view i32(buf.data(), 64, cc::dtype::int32, cc::device::cuda(0));
  const cc::tensor_view short_f32(buf.data(), 63, cc::dtype::float32, cc::device::cuda(0));
  std::vector<float> host(64);
  const cc::tensor_view on_host(host);
  auto refused = [](auto&& f, const std::string& words, const char* what) {
    try {
      f();
    } catch (const corodist::usage_error& e) {
      BOOST_TEST_MESSAGE(what << ": " << e.what());
      BOOST_TEST(std::string(e.what()).find(words) != std::string::npos, what << ": " << e.what());
      return;
    }
    BOOST_ERROR(what << ": not refused with usage_error");
  };
  refused([&] { s.convert(i32, f32); }, "int32", "an int32 source");
  refused([&] { s.convert(f32, i32); }, "int32", "an int32 destination");
  refused([&] { s.convert(f32, short_f32); }, "64 elements into 63", "mismatched counts");
  refused([&] { s.convert(on_host, f32); }, "cpu", "a host source");
  refused([&] { s.convert(f32, on_host); }, "cpu", "a host destination");
  refused([&] { s.convert(f32, f32, 0); }, "divisor", "a zero divisor");
  s.synchronize(); // nothing was queued that could fail
}
#endif

BOOST_AUTO_TEST_SUITE_END()
