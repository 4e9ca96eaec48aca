#pragma once
// What the Gloo backend's operation families share (one family per file, as
// Gloo keeps one algorithm per header: allreduce.cpp, broadcast.cpp,
// allgather.cpp, reduce_scatter.cpp, barrier.cpp, coalesced.cpp; the call
// check in call_check.cpp; the dispatch in ops.cpp): our slot prefixes, the
// time left, Gloo objects kept until the work completes, typed buffers for
// Gloo's options, and each family's entry point. Every function runs on the
// calling (communication) thread and throws Gloo's exceptions on I/O failure
// or timeout.

#include <corodist/collective/process_group.hpp>

#include "collective/gloo/ops.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace corodist::collective::detail {

// Our slot prefixes, clear of Gloo's own (0x01..0x08).
inline constexpr std::uint8_t header_slot_prefix = 0xc1;
inline constexpr std::uint8_t reduce_scatter_slot_prefix = 0xc2;
inline constexpr std::uint8_t pairwise_slot_prefix = 0xc3;   // check_pairwise's counts
inline constexpr std::uint8_t exchange_slot_prefix = 0xc4;   // all_to_all's data
inline constexpr std::uint8_t p2p_slot_prefix = 0xc5;        // send/recv (PyTorch's ranks: the tag alone)
inline constexpr std::uint8_t monitor_slot_prefix = 0xc6;    // monitored_barrier

/// Time left before the deadline, at least 1 ms (Gloo treats 0 as "unset").
inline std::chrono::milliseconds time_left(const gloo_call& gc) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(gc.deadline - std::chrono::steady_clock::now());
  return std::max(ms, std::chrono::milliseconds(1));
}

/// Makes a Gloo object that lives until the collective's work has completed.
template <typename T, typename... A>
T& kept(const gloo_call& gc, A&&... a) {
  auto p = std::make_shared<T>(std::forward<A>(a)...);
  gc.keep->push_back(p);
  return *p;
}

/// Sets the output of Gloo's options `o` to `count` elements of `esize` bytes at `data`.
template <typename Options>
void set_output(Options& o, void* data, std::size_t count, std::size_t esize) {
  switch (esize) {
  case 1: o.template setOutput<std::uint8_t>(static_cast<std::uint8_t*>(data), count); break;
  case 2: o.template setOutput<std::uint16_t>(static_cast<std::uint16_t*>(data), count); break;
  case 4: o.template setOutput<std::uint32_t>(static_cast<std::uint32_t*>(data), count); break;
  default: o.template setOutput<std::uint64_t>(static_cast<std::uint64_t*>(data), count); break;
  }
}

/// Sets the input of Gloo's options `o` to `count` elements of `esize` bytes at `data`.
template <typename Options>
void set_input(Options& o, void* data, std::size_t count, std::size_t esize) {
  switch (esize) {
  case 1: o.template setInput<std::uint8_t>(static_cast<std::uint8_t*>(data), count); break;
  case 2: o.template setInput<std::uint16_t>(static_cast<std::uint16_t*>(data), count); break;
  case 4: o.template setInput<std::uint32_t>(static_cast<std::uint32_t*>(data), count); break;
  default: o.template setInput<std::uint64_t>(static_cast<std::uint64_t*>(data), count); break;
  }
}

// ---- allreduce.cpp ----

/// Whether an allreduce of `bytes` runs on the ring (else bcube): small
/// buffers go through bcube (recursive halving/doubling: the fewest messages),
/// large ones through the ring (as PyTorch's ProcessGroupGloo), whose pipelined
/// segments use the bandwidth.
bool on_ring(std::size_t bcube_max_bytes, std::size_t bytes);

/// The bytes an allreduce of `t` with `op` reduces: integers averaged are summed in int64.
std::size_t reduced_bytes(const tensor_view& t, reduce_op op);

/// Allreduce of `t` with `op`, avg included (integers via int64).
void allreduce_one(const gloo_call& gc, const tensor_view& t, reduce_op op);

// ---- rooted.cpp ----

/// Gather of every rank's `in` into `out` on `root`.
void gather(const gloo_call& gc, const tensor_view& in, const tensor_view& out, int root);

/// Scatter of `in`'s blocks on `root` into every rank's `out`.
void scatter(const gloo_call& gc, const tensor_view& in, const tensor_view& out, int root);

/// Reduce of `t` with `op` into `t` on `root` (avg included, integers via int64).
void reduce_one(const gloo_call& gc, const tensor_view& t, reduce_op op, int root);

// ---- all_to_all.cpp ----

/// all_to_all_single or all_to_all of `call`; `pytorch`: as PyTorch's ranks
/// run it (Gloo's alltoall/alltoallv), else on slots that carry each block's size.
void all_to_all(const gloo_call& gc, const collective_call& call, bool pytorch);

// ---- broadcast.cpp ----

/// Broadcast of `t` from `root`.
void broadcast_one(const gloo_call& gc, const tensor_view& t, int root);

// ---- allgather.cpp ----

/// Allgather of `in` from every rank into `out` (more than one rank).
void allgather(const gloo_call& gc, const tensor_view& in, const tensor_view& out);

/// Allgather of `counts[r]` elements from each rank r into `out`.
void allgatherv(const gloo_call& gc, const tensor_view& in, const tensor_view& out,
                const std::vector<std::size_t>& counts);

// ---- reduce_scatter.cpp ----

/// Reduce-scatter of `in` (n chunks of `out`'s size) with `op` into `out`,
/// as our own ring.
void reduce_scatter(const gloo_call& gc, const tensor_view& in, const tensor_view& out, reduce_op op);

// ---- barrier.cpp ----

/// Gloo's barrier.
void barrier(const gloo_call& gc);

// ---- coalesced.cpp ----

/// Allreduce of every buffer of `ts` with `op`, packed into staging buckets.
void allreduce_coalesced(const gloo_call& gc, const std::vector<tensor_view>& ts, reduce_op op);

/// Broadcast of every buffer of `ts` from `root`, packed into staging buckets.
void broadcast_coalesced(const gloo_call& gc, const std::vector<tensor_view>& ts, int root);

} // namespace corodist::collective::detail
