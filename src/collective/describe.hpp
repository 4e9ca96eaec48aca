#pragma once
// Text and errors for a collective: what the call was ("allreduce(float32 x 1000, sum)")
// and where it ran ("allreduce #7 on rank 1 of 3 (gloo group 'corodist/pg')").

#include <corodist/collective/errors.hpp>
#include <corodist/collective/process_group.hpp>

#include <fmt/format.h>

#include <string>

namespace corodist::collective::detail {

/// "allreduce(float32 x 1000, sum)", "broadcast(int64 x 3, root 1)",
/// "allreduce_coalesced(3 buffers: float32 x 10, ..., sum)", "barrier()".
std::string describe(const collective_call& call);

/// Appends the arguments of `call` as describe() says them, without the
/// kind and parentheses ("float32 x 1000, sum"), to `out`: no allocation
/// while they fit the buffer's inline storage (the flight recorder's detail).
void describe_args_to(fmt::memory_buffer& out, const collective_call& call);

/// "send(float32 x 4 to rank 1, tag 0)", "recv(int64 x 2 from any rank, tag 3)".
std::string describe(const p2p_op& op);

/// "allreduce #7 on rank 1 of 3 (gloo group 'corodist/pg')".
std::string where(const collective_call& call, std::uint64_t seq, int rank, int size, const std::string& group);

/// Where a collective runs, for its errors.
struct call_site {
  const collective_call& call;
  std::uint64_t seq;
  int rank;
  int size;
  const std::string& group;
};

/// "<where>: <what>" as a collective_error.
collective_error error_at(const call_site& site, const std::string& what);

/// "<where>: <what>" as a collective_timeout_error.
collective_timeout_error timeout_at(const call_site& site, const std::string& what);

} // namespace corodist::collective::detail
