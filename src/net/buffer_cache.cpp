#include "net/buffer_cache.hpp"

#include "core/log.hpp"

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace corodist::net::detail {

namespace {

constexpr std::size_t max_buffers = 4;

/// The starting cap: CORODIST_BUFFER_CACHE_MIB when it holds a number, else the default.
std::size_t initial_limit() {
  const char* env = std::getenv("CORODIST_BUFFER_CACHE_MIB");
  if (env == nullptr || *env == '\0')
    return default_buffer_cache_bytes;
  char* end = nullptr;
  errno = 0;
  const unsigned long long mib = std::strtoull(env, &end, 10);
  if (errno != 0 || *end != '\0' || *env == '-' || mib > (std::numeric_limits<std::size_t>::max() >> 20)) {
    CORODIST_LOG_WARN("CORODIST_BUFFER_CACHE_MIB='{}' is not a size in MiB; using {} MiB", env,
                      default_buffer_cache_bytes >> 20);
    return default_buffer_cache_bytes;
  }
  return static_cast<std::size_t>(mib) << 20;
}

struct cache {
  std::mutex mutex;
  std::vector<bytes> buffers;
  std::size_t bytes_held = 0;
  std::size_t limit = initial_limit();
};

cache& the_cache() {
  static cache* c = new cache; // never destroyed: usable from any thread until exit
  return *c;
}

} // namespace

bytes reserved_buffer(std::size_t n) {
  bytes b;
  b.reserve(n);
  return b;
}

bytes fresh_buffer(std::size_t n) {
  bytes b = reserved_buffer(n);
  b.resize(n);
  return b;
}


void free_buffer(bytes&& b) noexcept {
  bytes dropped = std::move(b);
#if defined(__linux__)
  if (dropped.capacity() < recycle_min_size)
    return;
  static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto from = (reinterpret_cast<std::uintptr_t>(dropped.data()) + page - 1) & ~(page - 1);
  const auto to = (reinterpret_cast<std::uintptr_t>(dropped.data()) + dropped.capacity()) & ~(page - 1);
  // The pages are the buffer's until it is freed: the allocator's own words
  // around them are left alone, and what it writes into the block once it is
  // free lands in a zeroed page.
  if (to > from)
    ::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
#endif
}

bytes take_cached_buffer(std::size_t n) {
  if (n < recycle_min_size)
    return {};
  auto& c = the_cache();
  std::unique_lock lk(c.mutex);
  // The smallest cached buffer that holds n bytes without wasting more than half.
  std::size_t best = c.buffers.size();
  for (std::size_t i = 0; i < c.buffers.size(); ++i) {
    const auto cap = c.buffers[i].capacity();
    if (cap >= n && cap / 2 <= n && (best == c.buffers.size() || cap < c.buffers[best].capacity()))
      best = i;
  }
  if (best == c.buffers.size())
    return {};
  bytes b = std::move(c.buffers[best]);
  c.buffers.erase(c.buffers.begin() + static_cast<std::ptrdiff_t>(best));
  c.bytes_held -= b.capacity();
  lk.unlock();
  // Shrinking keeps the stale bytes (no memset); growing zero-fills the tail only.
  b.resize(n);
  return b;
}

bytes acquire_large_buffer(std::size_t n) {
  if (auto b = take_cached_buffer(n); !b.empty())
    return b;
  return fresh_buffer(n);
}

void recycle_large_buffer(bytes&& b) noexcept {
  bytes dropped = std::move(b);
  const auto cap = dropped.capacity();
  if (cap < recycle_min_size)
    return;
  {
    auto& c = the_cache();
    std::lock_guard lk(c.mutex);
    if (c.buffers.size() < max_buffers && c.bytes_held + cap <= c.limit) {
      c.bytes_held += cap;
      try {
        c.buffers.push_back(std::move(dropped));
        return;
      } catch (...) {
        c.bytes_held -= cap;
      }
    }
  }
  free_buffer(std::move(dropped)); // not kept: its pages go back to the system, after the lock
}

std::size_t cached_bytes() noexcept {
  auto& c = the_cache();
  std::lock_guard lk(c.mutex);
  return c.bytes_held;
}

} // namespace corodist::net::detail

namespace corodist::net {

std::shared_ptr<const bytes> share_buffer(bytes&& b) {
  if (b.capacity() < detail::recycle_min_size)
    return std::make_shared<const bytes>(std::move(b));
  return std::shared_ptr<const bytes>(new bytes(std::move(b)), [](const bytes* p) {
    auto* owned = const_cast<bytes*>(p);
    detail::recycle_large_buffer(std::move(*owned));
    delete owned;
  });
}

void release_buffer(bytes&& b) noexcept { detail::recycle_large_buffer(std::move(b)); }

void set_buffer_cache_limit(std::size_t max_bytes) noexcept {
  auto& c = detail::the_cache();
  std::array<bytes, detail::max_buffers> freed; // released after the lock
  {
    std::lock_guard lk(c.mutex);
    c.limit = max_bytes;
    for (std::size_t i = 0; c.bytes_held > c.limit && !c.buffers.empty(); ++i) {
      c.bytes_held -= c.buffers.back().capacity();
      freed[i] = std::move(c.buffers.back());
      c.buffers.pop_back();
    }
  }
  for (auto& b : freed)
    detail::free_buffer(std::move(b));
}

std::size_t buffer_cache_limit() noexcept {
  auto& c = detail::the_cache();
  std::lock_guard lk(c.mutex);
  return c.limit;
}

} // namespace corodist::net
