#pragma once
// Running one collective on a connected Gloo context, on the calling
// (communication) thread: the call-header check between ranks
// (call_check.cpp), then the data movement (ops.cpp, one operation family per
// file: Gloo's algorithms; reduce_scatter as our own ring); and the record of
// what decides a call's messages.

#include <corodist/collective/process_group.hpp>

#include "collective/gloo/call_header.hpp"

#include <gloo/context.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace corodist::collective::detail {

/// One collective call as Gloo runs it: the group's connected context, the
/// call's Gloo tag and deadline, the group's algorithm settings, and where its
/// Gloo objects are kept until its work completes.
struct gloo_call {
  std::shared_ptr<gloo::Context> context;
  std::uint32_t tag = 0;                        ///< Gloo tag of the data (data_tag(); PyTorch: 0, 1, 2, ...)
  std::chrono::steady_clock::time_point deadline; ///< every wait gives up here
  std::size_t bucket_bytes = 0;                 ///< staging size of coalesced calls
  std::size_t bcube_max_bytes = 0;              ///< allreduces up to this size use bcube, larger the ring
  /// Gloo's option objects and buffers of the collective, released only after
  /// its work has completed: releasing an unbound buffer may wait for Gloo's
  /// event-loop thread, which may be waiting for the next collective (as
  /// PyTorch, complete first, then release).
  std::vector<std::shared_ptr<void>>* keep = nullptr;
  bool pytorch = false; ///< run as PyTorch's ranks do (Gloo's algorithms, its tags)
};

/// The other ranks' call headers of one collective, received into buffers
/// posted when the collective is issued (Gloo sends only into a receive
/// already posted).
struct header_inbox;

/// This rank's call header of one collective, on its way to every other rank.
struct header_outbox;

/// Posts the receives of the headers of the collective with Gloo tag `tag`.
std::shared_ptr<header_inbox> post_header_inbox(const std::shared_ptr<gloo::Context>& context, std::uint32_t tag);

/// Sends the header of `call` (number `seq`, Gloo tag `tag`) and its call
/// site (compared when `compare_sites`) to every other rank. Called where
/// the collective is issued, so that the header is on the wire while the
/// communication thread is still waking up.
std::shared_ptr<header_outbox> post_header_outbox(const std::shared_ptr<gloo::Context>& context,
                                                  const collective_call& call, std::uint64_t seq, std::uint32_t tag,
                                                  bool compare_sites);

/// Waits for the headers in `inbox` and the sends of `outbox`, and compares.
/// Returns "" when all ranks made the same call, else a text naming this
/// rank's call and the first different one, with their numbers and call
/// sites ("rank 0 called allreduce #2 (...) at a.cpp:4, rank 2 called ...").
/// Throws Gloo's exceptions on I/O failure or timeout.
std::string check_call(const gloo_call& gc, header_inbox& inbox, header_outbox& outbox);

/// For a per_peer() call whose headers agreed: every rank sends every other
/// its counts for each peer (to and from), so that each rank checks the
/// whole matrix and all reach the same verdict. Returns "" when every pair
/// agrees, else a text naming the first pair that does not. Throws Gloo's
/// exceptions on I/O failure or timeout.
std::string check_pairwise(const gloo_call& gc, const collective_call& call, std::uint32_t tag);

/// The elements `call` (all_to_all or all_to_all_single) sends to `peer`
/// (`out` false) or receives from it (`out` true).
std::size_t pair_count(const collective_call& call, int peer, int size, bool out);

/// The record of `call` (collective `seq` on `rank`) in a group whose
/// allreduces up to `bcube_max_bytes` use bcube and whose coalesced calls
/// stage `bucket_bytes`: what decides its messages.
call_record record_of(const collective_call& call, std::uint64_t seq, int rank, std::size_t bcube_max_bytes,
                      std::size_t bucket_bytes);

/// monitored_barrier (monitored_barrier.cpp): returns the ranks that did not
/// arrive at rank 0 by `arrive_by` (empty: all did). Every other wait is
/// bounded by the call's deadline. Throws Gloo's exceptions on I/O failure.
std::vector<int> monitored_barrier(const gloo_call& gc, std::chrono::steady_clock::time_point arrive_by);

/// Runs `call`; throws Gloo's exceptions on I/O failure or timeout.
void run_collective(const gloo_call& gc, const collective_call& call);

} // namespace corodist::collective::detail
