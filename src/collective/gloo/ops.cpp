// Running one collective on a connected Gloo context: the dispatch to its
// operation family (algorithms.hpp), and the record of what decides a call's
// messages.
#include "collective/gloo/ops.hpp"
#include "collective/gloo/algorithms.hpp"
#include "collective/gloo/call_header.hpp"

#include <corodist/core/error.hpp>

#include <cstring>

namespace corodist::collective::detail {

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
      allreduce_coalesced(gc, call.tensors, call.op);
    return;
  case collective_kind::broadcast_coalesced:
    if (n > 1)
      broadcast_coalesced(gc, call.tensors, call.root);
    return;
  case collective_kind::all_to_all_single:
  case collective_kind::all_to_all:
    all_to_all(gc, call, gc.pytorch);
    return;
  case collective_kind::gather:
    if (n > 1)
      gather(gc, call.tensors[0], call.tensors[1], call.root);
    else if (call.tensors[1].data() != call.tensors[0].data())
      std::memmove(call.tensors[1].data(), call.tensors[0].data(), call.tensors[0].bytes());
    return;
  case collective_kind::scatter:
    if (n > 1)
      scatter(gc, call.tensors[0], call.tensors[1], call.root);
    else if (call.tensors[1].data() != call.tensors[0].data())
      std::memmove(call.tensors[1].data(), call.tensors[0].data(), call.tensors[1].bytes());
    return;
  case collective_kind::reduce:
    if (n > 1)
      reduce_one(gc, call.tensors[0], call.op, call.root);
    return;
  case collective_kind::allgatherv:
    if (n > 1)
      allgatherv(gc, call.tensors[0], call.tensors[1], call.in_splits);
    else if (call.tensors[1].data() != call.tensors[0].data())
      std::memmove(call.tensors[1].data(), call.tensors[0].data(), call.tensors[0].bytes());
    return;
  case collective_kind::monitored_barrier: // run by the issue queue (its verdict names ranks)
  case collective_kind::send:
  case collective_kind::recv:
  case collective_kind::batch_isend_irecv: // point_to_point.cpp
    break;
  }
  throw usage_error("gloo: unknown collective");
}

} // namespace corodist::collective::detail
