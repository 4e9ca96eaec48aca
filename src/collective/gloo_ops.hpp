#pragma once
// Running one collective on a connected Gloo context, on the calling
// (communication) thread: the call-header check between ranks, then the
// data movement (Gloo's algorithms; reduce_scatter as our own ring).

#include <corodist/collective/process_group.hpp>

#include <gloo/context.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace corodist::collective::detail {

struct gloo_call_context {
  std::shared_ptr<gloo::Context> context;
  std::uint32_t tag = 0;                        ///< Gloo tag (PyTorch: one per collective, 0, 1, ...)
  std::chrono::steady_clock::time_point deadline; ///< every wait gives up here
  std::size_t bucket_bytes = 0;                 ///< staging size of coalesced calls
};

/// Exchanges a header describing `call` (number `seq`) with every other rank.
/// Returns "" when all ranks made the same call, else a text naming this
/// rank's call and the first different one ("rank 0 called ..., rank 2 called ...").
/// Throws Gloo's exceptions on I/O failure or timeout.
std::string check_call(const gloo_call_context& cc, const collective_call& call, std::uint64_t seq);

/// Runs `call`; throws Gloo's exceptions on I/O failure or timeout.
void run_collective(const gloo_call_context& cc, const collective_call& call);

} // namespace corodist::collective::detail
