#pragma once
// Fixtures of the CUDA tests (collective and ddp suites): preconditions that
// say why a GPU case is skipped, host <-> device copies through the library's
// own cuda_stream and device_buffer, test values in 16-bit dtypes, and a gate
// that holds a CUDA stream until the test opens it (work queued behind it
// cannot start: orderings and deadlines become deterministic, no kernel needed).

#include <corodist/collective/cuda_stream.hpp>
#include <corodist/collective/device_buffer.hpp>
#include <corodist/collective/float16.hpp>
#include <corodist/collective/nccl_group.hpp>
#include <corodist/collective/tensor_view.hpp>

#include <boost/test/unit_test.hpp>

#include "collective/gloo_fixtures.hpp"

#if CORODIST_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace corodist::test {

/// Precondition: CUDA can be used here (a device is present); else "skipped: <why>".
inline boost::test_tools::assertion_result cuda_usable(boost::unit_test::test_unit_id) {
  const auto why = collective::cuda_stream::unavailable_reason();
  boost::test_tools::assertion_result r(why.empty());
  if (!why.empty())
    r.message() << "skipped: this case needs a CUDA device: " << why;
  return r;
}

/// Precondition: CUDA cannot be used here (the cases that check what a
/// machine without a GPU is told).
inline boost::test_tools::assertion_result cuda_unusable(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r(!collective::cuda_stream::unavailable_reason().empty());
  if (!r)
    r.message() << "skipped: a CUDA device is usable here; this case checks the errors of a machine without one";
  return r;
}

/// Precondition: NCCL can run here (built, the plugin loads, a GPU); else "skipped: NCCL cannot run here: <why>".
inline boost::test_tools::assertion_result nccl_usable(boost::unit_test::test_unit_id) {
  const auto why = collective::nccl_group::unavailable_reason();
  boost::test_tools::assertion_result r(why.empty());
  if (!why.empty())
    r.message() << "skipped: NCCL cannot run here: " << why;
  return r;
}

/// Precondition: Gloo built and CUDA usable (the staged gloo_group's cases).
inline boost::test_tools::assertion_result gloo_and_cuda(boost::unit_test::test_unit_id id) {
  auto r = gloo_built(id);
  if (!r)
    return r;
  return cuda_usable(id);
}

/// Precondition: Gloo built and CUDA not usable.
inline boost::test_tools::assertion_result gloo_without_cuda(boost::unit_test::test_unit_id id) {
  auto r = gloo_built(id);
  if (!r)
    return r;
  return cuda_unusable(id);
}

/// `values` in `type` (float32, float64, float16 or bfloat16; rounded to nearest even), as bytes.
inline std::vector<std::byte> encode(collective::dtype type, const std::vector<float>& values) {
  namespace cc = collective;
  std::vector<std::byte> out(values.size() * cc::element_size(type));
  for (std::size_t i = 0; i < values.size(); ++i) {
    auto* at = out.data() + i * cc::element_size(type);
    switch (type) {
    case cc::dtype::float32: std::memcpy(at, &values[i], 4); break;
    case cc::dtype::float64: {
      const double d = values[i];
      std::memcpy(at, &d, 8);
      break;
    }
    case cc::dtype::float16: {
      const auto b = cc::float16::from_float(values[i]);
      std::memcpy(at, &b, 2);
      break;
    }
    case cc::dtype::bfloat16: {
      const auto b = cc::bfloat16::from_float(values[i]);
      std::memcpy(at, &b, 2);
      break;
    }
    default: throw std::logic_error("encode: not a floating dtype");
    }
  }
  return out;
}

/// The `count` elements of `type` at host memory `data`, as floats (exact for 16-bit dtypes).
inline std::vector<float> decode(collective::dtype type, const void* data, std::size_t count) {
  namespace cc = collective;
  std::vector<float> out(count);
  const auto* p = static_cast<const std::byte*>(data);
  for (std::size_t i = 0; i < count; ++i) {
    const auto* at = p + i * cc::element_size(type);
    std::uint16_t b = 0;
    switch (type) {
    case cc::dtype::float32: std::memcpy(&out[i], at, 4); break;
    case cc::dtype::float64: {
      double d = 0;
      std::memcpy(&d, at, 8);
      out[i] = static_cast<float>(d);
      break;
    }
    case cc::dtype::float16: std::memcpy(&b, at, 2); out[i] = cc::float16::to_float(b); break;
    case cc::dtype::bfloat16: std::memcpy(&b, at, 2); out[i] = cc::bfloat16::to_float(b); break;
    default: throw std::logic_error("decode: not a floating dtype");
    }
  }
  return out;
}

/// Device memory of CUDA device `dev` holding `values` in `type` (copied on
/// the device's legacy default stream, which is then synchronised).
inline collective::device_buffer to_device(int dev, collective::dtype type, const std::vector<float>& values) {
  const auto bytes = encode(type, values);
  auto buf = collective::device_buffer::allocate(collective::device::cuda(dev), bytes.size());
  const auto s = collective::cuda_stream::borrow(dev, nullptr);
  s.copy(buf.data(), bytes.data(), bytes.size());
  s.synchronize();
  return buf;
}

/// A view of `buf` as `count` elements of `type` (on the buffer's device).
inline collective::tensor_view view_of(const collective::device_buffer& buf, collective::dtype type, std::size_t count) {
  return collective::tensor_view(buf.data(), count, type, buf.where());
}

/// The elements of device view `v` as floats (copied on the device's legacy default stream, synchronised).
inline std::vector<float> from_device(const collective::tensor_view& v) {
  std::vector<std::byte> host(v.bytes());
  const auto s = collective::cuda_stream::borrow(v.where().index, nullptr);
  s.copy(host.data(), v.data(), host.size());
  s.synchronize();
  return decode(v.type(), host.data(), v.count());
}

/// "" when `got` equals `want` element for element, else the first difference.
inline std::string first_difference(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return std::to_string(got.size()) + " elements, want " + std::to_string(want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i]))
      return "element " + std::to_string(i) + ": " + std::to_string(got[i]) + " != " + std::to_string(want[i]);
  return {};
}

/// Rank r's element j of the exact test values: a small integer, so that
/// sums over up to 8 ranks, and their quotients by a power of two, are exact
/// in float32, float16 and bfloat16.
inline float small_value(int r, std::size_t j) { return static_cast<float>((r + 1) + static_cast<int>(j % 5)); }

/// small_value(r, from + j) for j < n.
inline std::vector<float> small_values(int r, std::size_t n, std::size_t from = 0) {
  std::vector<float> v(n);
  for (std::size_t j = 0; j < n; ++j)
    v[j] = small_value(r, from + j);
  return v;
}

/// The sum over ranks 0..size-1 of small_values(., n, from).
inline std::vector<float> small_sums(int size, std::size_t n, std::size_t from = 0) {
  std::vector<float> v(n, 0.0f);
  for (int r = 0; r < size; ++r)
    for (std::size_t j = 0; j < n; ++j)
      v[j] += small_value(r, from + j);
  return v;
}

/// `v` divided by `d`, element-wise in float.
inline std::vector<float> divided(std::vector<float> v, int d) {
  for (auto& x : v)
    x /= static_cast<float>(d);
  return v;
}

/// Throws (for rank bodies on threads) unless `got` equals `want`, naming the first difference.
inline void require_equal(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  const auto diff = first_difference(got, want);
  if (!diff.empty())
    throw std::runtime_error(what + ": " + diff);
}

#if CORODIST_TEST_CUDA
/// Holds a CUDA stream: work queued on it after construction starts only once
/// `open()` was called (a host function queued on the stream waits for it, at
/// most `limit`; `expired()` then says the gate gave up, which a test treats
/// as a failure: something waited for the held stream). The destructor opens
/// the gate and waits for the host function to end.
class stream_gate {
public:
  explicit stream_gate(const collective::cuda_stream& s, std::chrono::seconds limit = std::chrono::seconds(60))
      : stream_(s), limit_(limit) {
    if (cudaLaunchHostFunc(static_cast<cudaStream_t>(s.native()), &stream_gate::hold, this) != cudaSuccess)
      throw std::runtime_error("stream_gate: cudaLaunchHostFunc failed");
  }
  stream_gate(const stream_gate&) = delete;
  stream_gate& operator=(const stream_gate&) = delete;
  ~stream_gate() {
    open();
    std::unique_lock lk(m_);
    cv_.wait_for(lk, limit_, [&] { return done_; });
  }

  /// Lets the stream go on.
  void open() {
    std::lock_guard lk(m_);
    open_ = true;
    cv_.notify_all();
  }

  /// True when the host function gave up waiting (the gate was not opened within the limit).
  bool expired() const {
    std::lock_guard lk(m_);
    return expired_;
  }

private:
  static void CUDART_CB hold(void* self) {
    auto* g = static_cast<stream_gate*>(self);
    std::unique_lock lk(g->m_);
    g->expired_ = !g->cv_.wait_for(lk, g->limit_, [&] { return g->open_; });
    g->done_ = true;
    g->cv_.notify_all();
  }

  collective::cuda_stream stream_;
  std::chrono::seconds limit_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  bool open_ = false;
  bool done_ = false;
  bool expired_ = false;
};
#endif

} // namespace corodist::test
