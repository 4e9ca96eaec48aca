#pragma once
/// \file
/// corodist::net::bytes and the recycling of large receive buffers.

#include <corodist/core/config.hpp>

#include <cstddef>
#include <memory>
#include <vector>

namespace corodist::net {

/// Owned bytes of a frame payload.
using bytes = std::vector<std::byte>;

/// Default cap of the process-wide cache of large receive buffers (see
/// set_buffer_cache_limit).
inline constexpr std::size_t default_buffer_cache_bytes = std::size_t{512} << 20; // 512 MiB

/// Shares a received payload read-only (views into it stay valid while any
/// owner lives). When the last owner lets go, a buffer of 1 MiB or more goes
/// back to the receive-buffer cache instead of to the allocator: a recycled
/// buffer is already mapped, a fresh one costs a page fault per page.
/// Thread-safe.
[[nodiscard]] std::shared_ptr<const bytes> share_buffer(bytes&& b);

/// Gives a payload back once it has been read: a large one to the cache, others
/// to the allocator. Thread-safe; never throws.
void release_buffer(bytes&& b) noexcept;

/// Caps the process-wide cache in which payload buffers of 1 MiB and more are
/// kept for reuse. At most 4 buffers and `max_bytes` in all are kept; 0 turns
/// recycling off. Cached buffers above a lowered cap are freed at once. The cap
/// starts at default_buffer_cache_bytes, or at `CORODIST_BUFFER_CACHE_MIB` MiB
/// when that variable holds a number. Thread-safe; never throws.
void set_buffer_cache_limit(std::size_t max_bytes) noexcept;

/// The cache's current cap in bytes (see set_buffer_cache_limit). Thread-safe.
[[nodiscard]] std::size_t buffer_cache_limit() noexcept;

} // namespace corodist::net
