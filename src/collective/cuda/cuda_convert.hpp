#pragma once
// The dtype-converting, dividing copy of cuda_stream::convert: a kernel built
// with nvcc (cuda_convert.cu) into the CUDA plugin. Plain C++ on this side, so
// that the plugin's other files need no nvcc.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace corodist::collective::detail {

/// Queues dst[i] = src[i] / divisor (i < count) on `stream`; dtypes are
/// collective::dtype values of float32, float64, float16 or bfloat16. Returns
/// the launch's error (cudaErrorNotSupported for another dtype).
cudaError_t launch_convert(const void* src, std::uint8_t src_type, void* dst, std::uint8_t dst_type,
                           std::size_t count, int divisor, cudaStream_t stream);

} // namespace corodist::collective::detail
