#pragma once
// Recycling of large frame buffers. A fresh buffer of many MiB costs a page
// fault (and the kernel's zeroing of the page) for every page on first touch,
// which dominated a 64 MiB RPC echo; a recycled buffer is already mapped.
#include <corodist/net/buffer.hpp>

namespace corodist::net::detail {

/// Buffers from this size up are recycled.
inline constexpr std::size_t recycle_min_size = std::size_t{1} << 20;

/// Returns a buffer of `n` bytes: a recycled one with enough capacity if
/// there is one (its contents are stale: the caller overwrites them all), else
/// a new one. Thread-safe.
bytes acquire_large_buffer(std::size_t n);

/// Returns a cached buffer of `n` bytes (contents stale) if the cache holds one
/// that fits without wasting more than half, else an empty buffer. Taking it
/// costs no new memory: the process holds it already. Thread-safe.
bytes take_cached_buffer(std::size_t n);

/// A new buffer of `n` bytes (never a cached one).
bytes fresh_buffer(std::size_t n);
/// An empty buffer with room for `n` bytes, none of them touched yet: its memory
/// is committed as it is filled. No transparent huge pages: on a VM whose host backs
/// memory on first use, faulting one in held the loop for 5 ms (2.6 ms per MiB
/// against 0.4 with 4 KiB pages), and recycled buffers gained nothing from them.
bytes reserved_buffer(std::size_t n);

/// Offers `b` for reuse (kept if large enough and the cache has room: at most
/// 4 buffers, buffer_cache_limit() bytes in all); otherwise frees it. Thread-safe.
void recycle_large_buffer(bytes&& b) noexcept;

/// Frees `b`; a buffer of recycle_min_size or more gives its whole pages back
/// to the system first (madvise MADV_DONTNEED). glibc keeps a freed block below
/// its dynamic mmap threshold (which rises to the size of the largest mapped
/// block freed, up to 32 MiB) in the heap of the thread that allocated it, and
/// malloc_trim does not return the free top of a thread's heap: without this
/// the last large buffer a loop thread freed stayed resident. Any thread; never
/// throws.
void free_buffer(bytes&& b) noexcept;

/// Bytes of capacity the cache holds now. Thread-safe.
std::size_t cached_bytes() noexcept;

} // namespace corodist::net::detail
