#pragma once
// Element-wise reduction kernels for every dtype and reduce_op, and the
// finishing steps of avg. Used by the Gloo backend (and by anything that
// reduces host buffers).

#include <corodist/collective/reduce_op.hpp>
#include <corodist/collective/tensor_view.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace corodist::collective::detail {

/// out[i] = a[i] (op) b[i] for i < n; `out` may alias `a` or `b`.
using reduce_fn = void (*)(void* out, const void* a, const void* b, std::size_t n);

/// The kernel of `op` on `t` (avg: the sum; finish with divide()).
reduce_fn reduce_function(dtype t, reduce_op op);

/// Divides every element of `t` by `divisor` (floating dtypes; rounds to the dtype).
void divide(const tensor_view& t, int divisor);

/// out[i] = (a[i] + b[i]) / divisor for i < n, elements of floating dtype
/// `t`: an average's last addition with its division in the same pass (the
/// sum rounded to the dtype, then divided: what the sum kernel followed by
/// divide() gives). `out` may alias `a` or `b`. Throws usage_error for an
/// integer dtype.
void add_divided(dtype t, void* out, const void* a, const void* b, std::size_t n, int divisor);

/// Copies integer buffer `t` into int64 `out` (resized).
void widen(const tensor_view& t, std::vector<std::int64_t>& out);

/// Writes `in[i] / divisor` (truncated toward zero) into integer buffer `t`.
void narrow_divided(const std::vector<std::int64_t>& in, int divisor, const tensor_view& t);

} // namespace corodist::collective::detail
