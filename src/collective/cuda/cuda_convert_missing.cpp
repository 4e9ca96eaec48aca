// cuda_convert.hpp where no nvcc was found at build time: no kernel, and a
// launch that says so (cuda_runtime.cpp turns it into cuda_error).
#include "collective/cuda/cuda_convert.hpp"

namespace corodist::collective::detail {

cudaError_t launch_convert(const void*, std::uint8_t, void*, std::uint8_t, std::size_t, int, cudaStream_t) {
  return cudaErrorNotSupported;
}

} // namespace corodist::collective::detail
