// All-to-all on Gloo. Our ranks exchange each pair's block on a slot that
// carries a digest of the block's size, so that ranks whose split lists
// disagree exchange nothing (a mismatch stalls until the deadline or the call
// check; it never overflows a receive, which Gloo's event-loop thread would
// not survive). With PyTorch's ranks: Gloo's alltoall and alltoallv, as
// ProcessGroupGloo runs them.
#include "collective/gloo/algorithms.hpp"
#include "collective/gloo/call_header.hpp"

#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace corodist::collective::detail {

namespace {

// One rank's block of an all-to-all: where it is and how long.
struct block {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// The blocks `call` sends (out = false) or receives (out = true), one per rank.
std::vector<block> blocks_of(const collective_call& call, int size, bool out) {
  const auto n = static_cast<std::size_t>(size);
  std::vector<block> b(n);
  if (call.kind == collective_kind::all_to_all) {
    for (std::size_t p = 0; p < n; ++p)
      b[p] = {call.tensors[(out ? n : 0) + p].data(), call.tensors[(out ? n : 0) + p].bytes()};
    return b;
  }
  const auto& t = call.tensors[out ? 1 : 0];
  const auto esize = element_size(t.type());
  std::size_t at = 0;
  for (std::size_t p = 0; p < n; ++p) {
    const auto bytes = pair_count(call, static_cast<int>(p), size, out) * esize;
    b[p] = {static_cast<std::byte*>(t.data()) + at, bytes};
    at += bytes;
  }
  return b;
}

// The slot of a pair's block: the collective's tag, and 24 bits of its size.
std::uint64_t block_slot(std::uint32_t tag, std::size_t bytes) {
  fnv1a h;
  h.mix(bytes);
  return static_cast<std::uint64_t>(gloo::Slot::build(exchange_slot_prefix, tag)) | h.low24();
}

// all_to_all_single: one Gloo buffer per side, each block at its offset.
void exchange_in_place(const gloo_call& gc, const tensor_view& input, const tensor_view& output,
                       const std::vector<block>& sends, const std::vector<block>& recvs) {
  auto& ctx = *gc.context;
  const auto self = static_cast<std::size_t>(ctx.rank);
  const auto offset = [](const tensor_view& t, const block& b) {
    return static_cast<std::size_t>(static_cast<const std::byte*>(b.data) - static_cast<const std::byte*>(t.data()));
  };
  std::unique_ptr<gloo::transport::UnboundBuffer> in, out;
  int receives = 0, sent = 0;
  // Receives first, then sends in a rotating order (rank r starts with r+1),
  // so that no single rank is every rank's first target.
  for (int i = 1; i < ctx.size; ++i) {
    const auto p = static_cast<std::size_t>((ctx.rank + ctx.size - i) % ctx.size);
    if (recvs[p].bytes == 0)
      continue;
    if (!in)
      in = ctx.createUnboundBuffer(output.data(), output.bytes());
    in->recv(static_cast<int>(p), block_slot(gc.tag, recvs[p].bytes), offset(output, recvs[p]), recvs[p].bytes);
    ++receives;
  }
  for (int i = 1; i < ctx.size; ++i) {
    const auto p = static_cast<std::size_t>((ctx.rank + i) % ctx.size);
    if (sends[p].bytes == 0)
      continue;
    if (!out)
      out = ctx.createUnboundBuffer(input.data(), input.bytes());
    out->send(static_cast<int>(p), block_slot(gc.tag, sends[p].bytes), offset(input, sends[p]), sends[p].bytes);
    ++sent;
  }
  if (recvs[self].bytes != 0)
    std::memcpy(recvs[self].data, sends[self].data, recvs[self].bytes); // (the buffers never overlap)
  for (int k = 0; k < receives; ++k)
    in->waitRecv(time_left(gc));
  for (int k = 0; k < sent; ++k)
    out->waitSend(time_left(gc));
}

template <typename T>
void pytorch_all_to_all(const gloo_call& gc, const collective_call& call) {
  const auto& in = call.tensors[0];
  const auto& out = call.tensors[1];
  if (call.in_splits.empty() && call.out_splits.empty()) {
    auto& o = kept<gloo::AlltoallOptions>(gc, gc.context);
    o.setInput(static_cast<T*>(in.data()), in.count());
    o.setOutput(static_cast<T*>(out.data()), out.count());
    o.setTag(gc.tag);
    o.setTimeout(time_left(gc));
    gloo::alltoall(o);
    return;
  }
  std::vector<std::int64_t> sends, recvs;
  for (int p = 0; p < gc.context->size; ++p) {
    sends.push_back(static_cast<std::int64_t>(pair_count(call, p, gc.context->size, false)));
    recvs.push_back(static_cast<std::int64_t>(pair_count(call, p, gc.context->size, true)));
  }
  auto& o = kept<gloo::AlltoallvOptions>(gc, gc.context);
  o.setInput(static_cast<T*>(in.data()), sends);
  o.setOutput(static_cast<T*>(out.data()), recvs);
  o.setTag(gc.tag);
  o.setTimeout(time_left(gc));
  gloo::alltoallv(o);
}

} // namespace

void all_to_all(const gloo_call& gc, const collective_call& call, bool pytorch) {
  auto& ctx = *gc.context;
  if (pytorch) {
    switch (element_size(call.tensors[0].type())) {
    case 1: return pytorch_all_to_all<std::uint8_t>(gc, call);
    case 2: return pytorch_all_to_all<std::uint16_t>(gc, call);
    case 4: return pytorch_all_to_all<std::uint32_t>(gc, call);
    default: return pytorch_all_to_all<std::uint64_t>(gc, call);
    }
  }
  const auto sends = blocks_of(call, ctx.size, false);
  const auto recvs = blocks_of(call, ctx.size, true);
  const auto self = static_cast<std::size_t>(ctx.rank);
  if (call.kind == collective_kind::all_to_all_single)
    return exchange_in_place(gc, call.tensors[0], call.tensors[1], sends, recvs);
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> out, in;
  // Receives first, then sends in a rotating order (rank r starts with r+1),
  // so that no single rank is every rank's first target.
  for (int i = 1; i < ctx.size; ++i) {
    const auto p = static_cast<std::size_t>((ctx.rank + ctx.size - i) % ctx.size);
    if (recvs[p].bytes == 0)
      continue;
    in.push_back(ctx.createUnboundBuffer(recvs[p].data, recvs[p].bytes));
    in.back()->recv(static_cast<int>(p), block_slot(gc.tag, recvs[p].bytes));
  }
  for (int i = 1; i < ctx.size; ++i) {
    const auto p = static_cast<std::size_t>((ctx.rank + i) % ctx.size);
    if (sends[p].bytes == 0)
      continue;
    out.push_back(ctx.createUnboundBuffer(sends[p].data, sends[p].bytes));
    out.back()->send(static_cast<int>(p), block_slot(gc.tag, sends[p].bytes));
  }
  if (recvs[self].bytes != 0 && recvs[self].data != sends[self].data)
    std::memmove(recvs[self].data, sends[self].data, recvs[self].bytes);
  for (auto& b : in)
    b->waitRecv(time_left(gc));
  for (auto& b : out)
    b->waitSend(time_left(gc));
}

} // namespace corodist::collective::detail
