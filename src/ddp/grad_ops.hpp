#pragma once
// Element-wise work of the reducer on host gradients: copy into a bucket
// (divided by the world size), copy back, and the float16 round trip of the
// fp16 compression hook.

#include <corodist/collective/float16.hpp>
#include <corodist/collective/tensor_view.hpp>

#include <cstddef>

namespace corodist::ddp::detail {

/// Copies `bytes` from `src` to `dst` (not overlapping). Copies of at least
/// streaming_copy_min bytes write around the caches (streaming stores): a
/// gradient copied into its bucket is next read by the allreduce, and one
/// copied back by the optimizer, both long after this many bytes have gone
/// through the caches. glibc's memcpy streams only above three quarters of the
/// last-level cache, which a VM may report as its host's (480 MiB on this
/// project's machines): its cached stores made the reducer's two copies of
/// 100 MiB take 31 ms against 19 ms streamed.
void copy_gradient(void* dst, const void* src, std::size_t bytes) noexcept;

/// The size from which copy_gradient streams.
inline constexpr std::size_t streaming_copy_min = std::size_t{1} << 20;

/// dst[i] = src[i] / divisor for i < n (floating dtypes; divisor 1: a plain
/// copy). `dst` may equal `src` (in place).
void copy_divided(void* dst, const void* src, std::size_t n, collective::dtype type, int divisor);

/// Whether gradients of `type` are divided by the world size before their
/// sum, as PyTorch does for every dtype: 16-bit floats, whose sum of
/// undivided values may overflow. The others are averaged by the allreduce
/// itself (reduce_op::avg; Gloo's ring divides in its last addition, so no
/// pass over the gradients of its own).
bool divide_before_sum(collective::dtype type);

/// out[i] = float16(t[i] / divisor).
void to_float16(const collective::tensor_view& t, collective::float16* out, int divisor);

/// t[i] = float(in[i]) in t's dtype.
void from_float16(const collective::float16* in, const collective::tensor_view& t);

} // namespace corodist::ddp::detail
