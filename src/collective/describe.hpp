#pragma once
// Text for errors and logs: what a collective call was ("allreduce(float32 x 1000, sum)")
// and where it ran ("allreduce #7 on rank 1 of 3 (gloo group 'corodist/pg')").

#include <corodist/collective/process_group.hpp>

#include <string>

namespace corodist::collective::detail {

/// "allreduce(float32 x 1000, sum)", "broadcast(int64 x 3, root 1)",
/// "allreduce_coalesced(3 buffers: float32 x 10, ..., sum)", "barrier()".
std::string describe(const collective_call& call);

/// "allreduce #7 on rank 1 of 3 (gloo group 'corodist/pg')".
std::string where(const collective_call& call, std::uint64_t seq, int rank, int size, const std::string& group);

} // namespace corodist::collective::detail
