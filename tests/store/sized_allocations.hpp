#pragma once
// Counts the heap allocations of one exact size, made by any thread of the
// test executable (the store tests' global operator new counts them): a test
// picks a size nothing else allocates (a key of an odd length) and sees
// whether the server copied such keys.

#include <cstddef>

namespace corodist::test {

/// From now on, counts the allocations of exactly `bytes` bytes (and forgets
/// the earlier count). Thread-safe.
void count_allocations_of(std::size_t bytes) noexcept;
/// The allocations of the size given to count_allocations_of since that call.
std::size_t sized_allocations() noexcept;

} // namespace corodist::test
