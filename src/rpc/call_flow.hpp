#pragma once
// The flow id of one RPC call (private): the same value in the caller's
// flight-recorder entry ("call") and the callee's ("serve"), so that a
// timeline links them. Both sides know the caller's and callee's ranks and the
// request id the call travels with on the caller's connection.

#include <cstdint>

namespace corodist::rpc::detail {

/// A nonzero mix of (caller rank, callee rank, request id).
constexpr std::uint64_t call_flow(int caller, int callee, std::uint64_t request_id) noexcept {
  std::uint64_t x = (std::uint64_t(std::uint32_t(caller)) << 32 | std::uint32_t(callee)) ^
                    (request_id * 0x9e3779b97f4a7c15ull);
  x ^= x >> 30; // splitmix64's finaliser
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x != 0 ? x : 1;
}

} // namespace corodist::rpc::detail
