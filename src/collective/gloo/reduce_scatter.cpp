// Reduce-scatter on Gloo's transport, as our own ring (avg included:
// a floating avg divided in the last addition, integers via int64).
#include "collective/gloo/algorithms.hpp"
#include "collective/reduce.hpp"

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

namespace corodist::collective::detail {

namespace {

// Ring reduce-scatter over raw bytes: `in` holds n chunks of `count`
// elements; chunk `rank` of the reduction lands in `out`. At step s (of n-1)
// a rank sends its partial sum of chunk (rank-s-1) to the right and receives
// the left's partial of chunk (rank-s-2), adding its own input to it. With
// `average` (the dtype), the last addition also divides by n.
void ring_reduce_scatter(const gloo_call& gc, void* in, void* out, std::size_t count, std::size_t esize,
                         reduce_fn fn, std::optional<dtype> average = std::nullopt) {
  auto& ctx = *gc.context;
  const int n = ctx.size;
  const int rank = ctx.rank;
  const std::size_t chunk = count * esize;
  auto* in_bytes = static_cast<std::byte*>(in);
  if (n == 1) {
    if (out != in)
      std::memmove(out, in, chunk);
    return;
  }
  if (chunk == 0)
    return;
  auto mod = [n](int v) { return ((v % n) + n) % n; };
  const int right = mod(rank + 1);
  const int left_rank = mod(rank - 1);
  struct buffers { // members go in reverse order: Gloo's buffers before their memory
    std::vector<std::byte> acc, recv;
    std::unique_ptr<gloo::transport::UnboundBuffer> in_buf, acc_buf, recv_buf;
  };
  auto& b = kept<buffers>(gc);
  b.acc.resize(chunk);
  b.recv.resize(chunk);
  b.in_buf = ctx.createUnboundBuffer(in, chunk * static_cast<std::size_t>(n));
  b.acc_buf = ctx.createUnboundBuffer(b.acc.data(), chunk);
  b.recv_buf = ctx.createUnboundBuffer(b.recv.data(), chunk);
  auto& in_buf = b.in_buf;
  auto& acc_buf = b.acc_buf;
  auto& recv_buf = b.recv_buf;
  auto& acc = b.acc;
  auto& recv = b.recv;
  const auto slot = gloo::Slot::build(reduce_scatter_slot_prefix, gc.tag);
  for (int s = 0; s < n - 1; ++s) {
    const int send_chunk = mod(rank - s - 1);
    const int recv_chunk = mod(rank - s - 2);
    recv_buf->recv(left_rank, slot);
    auto& sender = s == 0 ? in_buf : acc_buf;
    if (s == 0)
      in_buf->send(right, slot, static_cast<std::size_t>(send_chunk) * chunk, chunk);
    else
      acc_buf->send(right, slot);
    recv_buf->waitRecv(time_left(gc));
    sender->waitSend(time_left(gc));
    const bool last = s == n - 2;
    const void* mine = in_bytes + static_cast<std::size_t>(recv_chunk) * chunk;
    if (last && average)
      add_divided(*average, out, recv.data(), mine, count, n);
    else
      fn(last ? out : acc.data(), recv.data(), mine, count);
  }
}

} // namespace

void reduce_scatter(const gloo_call& gc, const tensor_view& in, const tensor_view& out, reduce_op op) {
  const int n = gc.context->size;
  if (op == reduce_op::avg && !is_floating(in.type())) {
    std::vector<std::int64_t> wide_in, wide_out(out.count());
    widen(in, wide_in);
    ring_reduce_scatter(gc, wide_in.data(), wide_out.data(), out.count(), 8,
                        reduce_function(dtype::int64, reduce_op::sum));
    narrow_divided(wide_out, n, out);
    return;
  }
  // A floating avg divides in the last addition; with one rank, nothing to divide.
  ring_reduce_scatter(gc, in.data(), out.data(), out.count(), element_size(in.type()),
                      reduce_function(in.type(), op),
                      op == reduce_op::avg ? std::optional<dtype>(in.type()) : std::nullopt);
}

} // namespace corodist::collective::detail
