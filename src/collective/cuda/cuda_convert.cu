// cuda_stream::convert's kernel: dst[i] = src[i] / divisor in dst's dtype.
// Both of one 32- or 64-bit dtype: divided in that dtype; otherwise in float32
// and rounded to nearest even, as the host reducer's grad_ops do, so that the
// device and the host give the same bits.
#include "collective/cuda/cuda_convert.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace corodist::collective::detail {

namespace {

// collective::dtype's values (dtype.hpp), kept in step with it.
constexpr std::uint8_t f32 = 0, f64 = 1, f16 = 2, bf16 = 3;

template <class T>
__device__ float to_float(T v) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(v);
  else
    return static_cast<float>(v);
}

template <class T>
__device__ T from_float(float v) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else
    return static_cast<T>(v);
}

template <class S, class D>
__global__ void convert_kernel(const S* src, D* dst, std::size_t n, int divisor) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (std::is_same_v<S, D> && (std::is_same_v<S, float> || std::is_same_v<S, double>))
      dst[i] = divisor == 1 ? src[i] : src[i] / static_cast<S>(divisor);
    else
      dst[i] = from_float<D>(divisor == 1 ? to_float(src[i]) : to_float(src[i]) / static_cast<float>(divisor));
  }
}

constexpr unsigned threads = 256;
constexpr std::size_t max_blocks = 4096; // grid-stride beyond

template <class S, class D>
cudaError_t launch_as(const void* src, void* dst, std::size_t n, int divisor, cudaStream_t s) {
  if (n == 0)
    return cudaSuccess;
  std::size_t blocks = (n + threads - 1) / threads;
  if (blocks > max_blocks)
    blocks = max_blocks;
  convert_kernel<S, D><<<static_cast<unsigned>(blocks), threads, 0, s>>>(static_cast<const S*>(src),
                                                                         static_cast<D*>(dst), n, divisor);
  return cudaGetLastError();
}

template <class S>
cudaError_t launch_from(const void* src, std::uint8_t dt, void* dst, std::size_t n, int divisor, cudaStream_t s) {
  switch (dt) {
  case f32: return launch_as<S, float>(src, dst, n, divisor, s);
  case f64: return launch_as<S, double>(src, dst, n, divisor, s);
  case f16: return launch_as<S, __half>(src, dst, n, divisor, s);
  case bf16: return launch_as<S, __nv_bfloat16>(src, dst, n, divisor, s);
  default: return cudaErrorNotSupported;
  }
}

} // namespace

cudaError_t launch_convert(const void* src, std::uint8_t src_type, void* dst, std::uint8_t dst_type,
                           std::size_t count, int divisor, cudaStream_t stream) {
  switch (src_type) {
  case f32: return launch_from<float>(src, dst_type, dst, count, divisor, stream);
  case f64: return launch_from<double>(src, dst_type, dst, count, divisor, stream);
  case f16: return launch_from<__half>(src, dst_type, dst, count, divisor, stream);
  case bf16: return launch_from<__nv_bfloat16>(src, dst_type, dst, count, divisor, stream);
  default: return cudaErrorNotSupported;
  }
}

} // namespace corodist::collective::detail
