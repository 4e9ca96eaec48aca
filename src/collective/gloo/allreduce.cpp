// Allreduce on Gloo: bcube for small buffers, the ring for large ones, and
// avg (a floating avg divided in the ring's last addition, integers via int64).
#include "collective/gloo/algorithms.hpp"
#include "collective/reduce.hpp"

#include <gloo/allreduce.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace corodist::collective::detail {

namespace {

// Gloo's ring splits a buffer into segments of at most this many bytes; set
// explicitly because ring_owned_bytes() mirrors the split.
constexpr std::size_t ring_max_segment_bytes = std::size_t{1} << 20;

// The bytes [first, second) of a `total`-byte buffer whose reduction Gloo's
// ring (gloo/allreduce.cc, ring()) completes on `rank` of `n`: the buffer is
// cut into a multiple of n segments, at least 2n, and rank r ends its
// reduce-scatter holding chunk r (segments r * per_rank ...), which it then
// sends first in the allgather. Every other byte is added to on this rank at
// most once, as a partial sum that travels on.
std::pair<std::size_t, std::size_t> ring_owned_bytes(std::size_t total, std::size_t esize, int n, int rank) {
  const auto un = static_cast<std::size_t>(n);
  const std::size_t max_segment = esize * std::max<std::size_t>(1, ring_max_segment_bytes / esize);
  std::size_t segments = std::max((total + max_segment - 1) / max_segment, 2 * un);
  segments = (segments + un - 1) / un * un;
  const std::size_t per_rank = segments / un;
  const std::size_t segment = ((total + segments - 1) / segments + esize - 1) / esize * esize;
  const std::size_t first = std::min(total, static_cast<std::size_t>(rank) * per_rank * segment);
  return {first, std::min(total, first + per_rank * segment)};
}

// Gloo's allreduce of `count` elements of `esize` bytes at `data`, in place,
// with reduction `fn`, on the ring or bcube (on_ring()).
void gloo_allreduce(const gloo_call& gc, void* data, std::size_t count, std::size_t esize,
                    gloo::AllreduceOptions::Func fn) {
  auto& o = kept<gloo::AllreduceOptions>(gc, gc.context);
  set_output(o, data, count, esize);
  o.setAlgorithm(on_ring(gc.bcube_max_bytes, count * esize) ? gloo::AllreduceOptions::Algorithm::RING
                                                             : gloo::AllreduceOptions::Algorithm::BCUBE);
  o.setMaxSegmentSize(ring_max_segment_bytes);
  o.setReduceFunction(std::move(fn));
  o.setTag(gc.tag);
  o.setTimeout(time_left(gc));
  gloo::allreduce(o);
}

} // namespace

bool on_ring(std::size_t bcube_max_bytes, std::size_t bytes) { return bytes > bcube_max_bytes; }

std::size_t reduced_bytes(const tensor_view& t, reduce_op op) {
  return t.count() * (op == reduce_op::avg && !is_floating(t.type()) ? 8 : element_size(t.type()));
}

// A floating avg on the ring divides in the last addition of each byte (on the
// rank that completes it), so it costs no pass over the buffer beyond the sum's.
void allreduce_one(const gloo_call& gc, const tensor_view& t, reduce_op op) {
  const int n = gc.context->size;
  if (t.count() == 0)
    return;
  if (op == reduce_op::avg && !is_floating(t.type())) {
    std::vector<std::int64_t> wide;
    widen(t, wide);
    gloo_allreduce(gc, wide.data(), wide.size(), 8, reduce_function(dtype::int64, reduce_op::sum));
    narrow_divided(wide, n, t);
    return;
  }
  const std::size_t esize = element_size(t.type());
  const auto sum = reduce_function(t.type(), op);
  if (op != reduce_op::avg || n == 1 || !on_ring(gc.bcube_max_bytes, t.count() * esize)) {
    gloo_allreduce(gc, t.data(), t.count(), esize, sum);
    if (op == reduce_op::avg && n > 1)
      divide(t, n);
    return;
  }
  const auto [first, last] = ring_owned_bytes(t.count() * esize, esize, n, gc.context->rank);
  const auto* base = static_cast<const std::byte*>(t.data());
  const auto type = t.type();
  gloo_allreduce(gc, t.data(), t.count(), esize,
                 [=](void* out, const void* a, const void* b, std::size_t count) {
                   // Split at the owned range's edges (a segment lies within or outside it).
                   const auto begin = static_cast<std::size_t>(static_cast<const std::byte*>(out) - base);
                   const auto end = begin + count * esize;
                   const auto lo = std::clamp(first, begin, end), hi = std::clamp(last, begin, end);
                   auto at = [&](const void* p, std::size_t off) { return static_cast<const std::byte*>(p) + (off - begin); };
                   auto* o = static_cast<std::byte*>(out);
                   if (lo > begin)
                     sum(o, a, b, (lo - begin) / esize);
                   if (hi > lo)
                     add_divided(type, o + (lo - begin), at(a, lo), at(b, lo), (hi - lo) / esize, n);
                   if (end > hi)
                     sum(o + (hi - begin), at(a, hi), at(b, hi), (end - hi) / esize);
                 });
}

} // namespace corodist::collective::detail
