// Running one collective on a connected Gloo context (the call-header check
// between ranks, then Gloo's algorithms; reduce_scatter as our own ring), and
// the record of what decides a call's messages.
#include "collective/gloo/ops.hpp"
#include "collective/gloo/call_header.hpp"
#include "collective/reduce.hpp"

#include <corodist/core/error.hpp>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

namespace corodist::collective::detail {

namespace {

using clock = std::chrono::steady_clock;

// Our slot prefixes, clear of Gloo's own (0x01..0x08).
constexpr std::uint8_t header_slot_prefix = 0xc1;
constexpr std::uint8_t reduce_scatter_slot_prefix = 0xc2;

// Time left before the deadline, at least 1 ms (Gloo treats 0 as "unset").
std::chrono::milliseconds left(const gloo_call& gc) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(gc.deadline - clock::now());
  return std::max(ms, std::chrono::milliseconds(1));
}

// ---- Gloo calls --------------------------------------------------------------

// Makes a Gloo object that lives until the collective's work has completed.
template <typename T, typename... A>
T& kept(const gloo_call& gc, A&&... a) {
  auto p = std::make_shared<T>(std::forward<A>(a)...);
  gc.keep->push_back(p);
  return *p;
}

template <typename Options>
void set_output(Options& o, void* data, std::size_t count, std::size_t esize) {
  switch (esize) {
  case 1: o.template setOutput<std::uint8_t>(static_cast<std::uint8_t*>(data), count); break;
  case 2: o.template setOutput<std::uint16_t>(static_cast<std::uint16_t*>(data), count); break;
  case 4: o.template setOutput<std::uint32_t>(static_cast<std::uint32_t*>(data), count); break;
  default: o.template setOutput<std::uint64_t>(static_cast<std::uint64_t*>(data), count); break;
  }
}

template <typename Options>
void set_input(Options& o, void* data, std::size_t count, std::size_t esize) {
  switch (esize) {
  case 1: o.template setInput<std::uint8_t>(static_cast<std::uint8_t*>(data), count); break;
  case 2: o.template setInput<std::uint16_t>(static_cast<std::uint16_t*>(data), count); break;
  case 4: o.template setInput<std::uint32_t>(static_cast<std::uint32_t*>(data), count); break;
  default: o.template setInput<std::uint64_t>(static_cast<std::uint64_t*>(data), count); break;
  }
}

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

// Small buffers go through bcube (recursive halving/doubling: the fewest
// messages), large ones through the ring (as PyTorch's ProcessGroupGloo),
// whose pipelined segments use the bandwidth.
bool on_ring(std::size_t bcube_max_bytes, std::size_t bytes) { return bytes > bcube_max_bytes; }

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
  o.setTimeout(left(gc));
  gloo::allreduce(o);
}

// The bytes an allreduce of `t` with `op` reduces: integers averaged are summed in int64.
std::size_t reduced_bytes(const tensor_view& t, reduce_op op) {
  return t.count() * (op == reduce_op::avg && !is_floating(t.type()) ? 8 : element_size(t.type()));
}

// Allreduce of `t` with `op`, avg included (integers via int64). A floating
// avg on the ring divides in the last addition of each byte (on the rank that
// completes it), so it costs no pass over the buffer beyond the sum's.
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

void broadcast_one(const gloo_call& gc, const tensor_view& t, int root) {
  if (t.count() == 0)
    return;
  auto& o = kept<gloo::BroadcastOptions>(gc, gc.context);
  set_output(o, t.data(), t.count(), element_size(t.type()));
  o.setRoot(root);
  o.setTag(gc.tag);
  o.setTimeout(left(gc));
  gloo::broadcast(o);
}

void allgather(const gloo_call& gc, const tensor_view& in, const tensor_view& out) {
  if (in.count() == 0)
    return;
  auto& o = kept<gloo::AllgatherOptions>(gc, gc.context);
  const auto esize = element_size(in.type());
  set_input(o, in.data(), in.count(), esize);
  set_output(o, out.data(), out.count(), esize);
  o.setTag(gc.tag);
  o.setTimeout(left(gc));
  gloo::allgather(o);
}

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
    recv_buf->waitRecv(left(gc));
    sender->waitSend(left(gc));
    const bool last = s == n - 2;
    const void* mine = in_bytes + static_cast<std::size_t>(recv_chunk) * chunk;
    if (last && average)
      add_divided(*average, out, recv.data(), mine, count, n);
    else
      fn(last ? out : acc.data(), recv.data(), mine, count);
  }
}

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

void barrier(const gloo_call& gc) {
  auto& o = kept<gloo::BarrierOptions>(gc, gc.context);
  o.setTag(gc.tag);
  o.setTimeout(left(gc));
  gloo::barrier(o);
}

// Coalesced calls: buffers grouped by dtype (in order of first appearance),
// packed into staging buckets of at most bucket_bytes; a bucket of one buffer
// runs in place. Every rank makes the same buckets from the same layout.
template <typename Run>
void coalesced(const gloo_call& gc, const std::vector<tensor_view>& ts, bool copy_back_on_root_too,
               int root, Run run) {
  std::vector<dtype> order;
  for (const auto& t : ts)
    if (std::find(order.begin(), order.end(), t.type()) == order.end())
      order.push_back(t.type());
  std::vector<std::byte> staging;
  std::vector<const tensor_view*> bucket;
  std::size_t bucket_bytes = 0;
  auto flush = [&] {
    if (bucket.empty())
      return;
    if (bucket.size() == 1) {
      run(*bucket[0]);
    } else {
      const auto type = bucket[0]->type();
      staging.resize(bucket_bytes);
      std::size_t off = 0;
      for (auto* t : bucket) {
        std::memcpy(staging.data() + off, t->data(), t->bytes());
        off += t->bytes();
      }
      run(tensor_view(staging.data(), bucket_bytes / element_size(type), type));
      if (copy_back_on_root_too || gc.context->rank != root) {
        off = 0;
        for (auto* t : bucket) {
          std::memcpy(t->data(), staging.data() + off, t->bytes());
          off += t->bytes();
        }
      }
    }
    bucket.clear();
    bucket_bytes = 0;
  };
  for (auto type : order) {
    for (const auto& t : ts) {
      if (t.type() != type || t.count() == 0)
        continue;
      if (!bucket.empty() && bucket_bytes + t.bytes() > gc.bucket_bytes)
        flush();
      bucket.push_back(&t);
      bucket_bytes += t.bytes();
    }
    flush();
  }
}

} // namespace

struct header_inbox {
  std::vector<call_header> headers;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
};

std::shared_ptr<header_inbox> post_header_inbox(const std::shared_ptr<gloo::Context>& context, std::uint32_t tag) {
  auto& ctx = *context;
  auto inbox = std::make_shared<header_inbox>();
  inbox->headers.resize(static_cast<std::size_t>(ctx.size));
  inbox->buffer = ctx.createUnboundBuffer(inbox->headers.data(), sizeof(call_header) * inbox->headers.size());
  const auto slot = gloo::Slot::build(header_slot_prefix, tag);
  for (int p = 0; p < ctx.size; ++p)
    if (p != ctx.rank)
      inbox->buffer->recv(p, slot, static_cast<std::size_t>(p) * sizeof(call_header), sizeof(call_header));
  return inbox;
}

struct header_outbox {
  call_header header;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
};

std::shared_ptr<header_outbox> post_header_outbox(const std::shared_ptr<gloo::Context>& context,
                                                  const collective_call& call, std::uint64_t seq, std::uint32_t tag) {
  auto& ctx = *context;
  auto outbox = std::make_shared<header_outbox>();
  outbox->header = header_of(call, seq);
  outbox->buffer = ctx.createUnboundBuffer(&outbox->header, sizeof outbox->header);
  const auto slot = gloo::Slot::build(header_slot_prefix, tag);
  for (int p = 0; p < ctx.size; ++p)
    if (p != ctx.rank)
      outbox->buffer->send(p, slot);
  return outbox;
}

std::string check_call(const gloo_call& gc, header_inbox& inbox, header_outbox& outbox) {
  auto& ctx = *gc.context;
  const int n = ctx.size;
  for (int p = 0; p < n; ++p)
    if (p != ctx.rank)
      inbox.buffer->waitRecv(left(gc));
  for (int p = 0; p < n; ++p)
    if (p != ctx.rank)
      outbox.buffer->waitSend(left(gc));
  const auto& mine = outbox.header;
  for (int p = 0; p < n; ++p) {
    const auto& other = inbox.headers[static_cast<std::size_t>(p)];
    if (p == ctx.rank || other == mine)
      continue;
    std::string text = fmt::format("the ranks' calls differ: rank {} called {}, rank {} called {}", ctx.rank,
                                   header_text(mine), p, header_text(other));
    if (other.seq != mine.seq)
      text += fmt::format(" (as its collective #{})", other.seq);
    return text;
  }
  return {};
}

call_record record_of(const collective_call& call, std::uint64_t seq, int rank, std::size_t bcube_max_bytes,
                      std::size_t bucket_bytes) {
  call_record r;
  r.header = header_of(call, seq);
  r.rank = rank;
  switch (call.kind) {
  case collective_kind::allreduce:
    r.ring = on_ring(bcube_max_bytes, reduced_bytes(call.tensors[0], call.op));
    break;
  case collective_kind::allreduce_coalesced:
    r.bcube_max_bytes = bcube_max_bytes;
    r.bucket_bytes = bucket_bytes;
    break;
  case collective_kind::broadcast_coalesced: r.bucket_bytes = bucket_bytes; break;
  default: break;
  }
  return r;
}

void run_collective(const gloo_call& gc, const collective_call& call) {
  const int n = gc.context->size;
  switch (call.kind) {
  case collective_kind::allreduce:
    if (n > 1)
      allreduce_one(gc, call.tensors[0], call.op);
    return;
  case collective_kind::broadcast:
    if (n > 1)
      broadcast_one(gc, call.tensors[0], call.root);
    return;
  case collective_kind::allgather:
    if (n > 1)
      allgather(gc, call.tensors[0], call.tensors[1]);
    else if (call.tensors[1].data() != call.tensors[0].data())
      std::memmove(call.tensors[1].data(), call.tensors[0].data(), call.tensors[0].bytes());
    return;
  case collective_kind::reduce_scatter:
    reduce_scatter(gc, call.tensors[0], call.tensors[1], call.op);
    return;
  case collective_kind::barrier:
    if (n > 1)
      barrier(gc);
    return;
  case collective_kind::allreduce_coalesced:
    if (n > 1)
      coalesced(gc, call.tensors, true, -1, [&](const tensor_view& t) { allreduce_one(gc, t, call.op); });
    return;
  case collective_kind::broadcast_coalesced:
    if (n > 1)
      coalesced(gc, call.tensors, false, call.root, [&](const tensor_view& t) { broadcast_one(gc, t, call.root); });
    return;
  }
  throw usage_error("gloo: unknown collective");
}

} // namespace corodist::collective::detail
