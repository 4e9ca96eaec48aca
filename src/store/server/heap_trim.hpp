#pragma once
// When the store server gives freed heap back to the system (private).

#include <cstddef>

namespace corodist::store::detail {

/// A connection (or its waits) that made the server hold at least this many
/// bytes trims the heap when it goes.
inline constexpr std::size_t heap_trim_after_bytes = std::size_t{1} << 20;

/// Gives the heap's free memory back to the system (glibc's malloc_trim) if
/// `held_bytes`, what a departing connection or its waits made the server
/// hold, is at least heap_trim_after_bytes. glibc returns freed memory below
/// the top of the heap only when asked, and after a large block was freed it
/// raises its own trim threshold to twice that block: without this call the
/// memory of a large refused request stays resident. malloc_trim does not
/// return the free top of a thread's heap (the loop's): net's receive path
/// gives a large payload's pages back itself once it has been handled
/// (net/buffer_cache.hpp, free_buffer). Returns whether it
/// trimmed. Costs a walk of the free heap (well under a millisecond for tens
/// of MiB); any thread.
bool trim_heap_after(std::size_t held_bytes) noexcept;

} // namespace corodist::store::detail
