#include "net/buffer_cache.hpp"

#include <sys/mman.h>

#include <mutex>
#include <vector>

namespace corodist::net::detail {

namespace {

constexpr std::size_t max_buffers = 4;
constexpr std::size_t max_bytes = std::size_t{512} << 20;
constexpr std::size_t huge_page = std::size_t{2} << 20;

struct cache {
  std::mutex mutex;
  std::vector<bytes> buffers;
  std::size_t bytes_held = 0;
};

cache& the_cache() {
  static cache* c = new cache; // never destroyed: usable from any thread until exit
  return *c;
}

bytes fresh_buffer(std::size_t n) {
  bytes b;
  if (n >= 2 * huge_page) {
    b.reserve(n);
    const auto p = reinterpret_cast<std::uintptr_t>(b.data());
    const auto begin = (p + huge_page - 1) & ~(huge_page - 1);
    const auto end = (p + n) & ~(huge_page - 1);
    if (end > begin)
      ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE); // advice only: failure is harmless
  }
  b.resize(n);
  return b;
}

} // namespace

bytes acquire_large_buffer(std::size_t n) {
  if (n >= recycle_min_size) {
    auto& c = the_cache();
    std::unique_lock lk(c.mutex);
    // The smallest cached buffer that holds n bytes without wasting more than half.
    std::size_t best = c.buffers.size();
    for (std::size_t i = 0; i < c.buffers.size(); ++i) {
      const auto cap = c.buffers[i].capacity();
      if (cap >= n && cap / 2 <= n && (best == c.buffers.size() || cap < c.buffers[best].capacity()))
        best = i;
    }
    if (best != c.buffers.size()) {
      bytes b = std::move(c.buffers[best]);
      c.buffers.erase(c.buffers.begin() + static_cast<std::ptrdiff_t>(best));
      c.bytes_held -= b.capacity();
      lk.unlock();
      // Shrinking keeps the stale bytes (no memset); growing zero-fills the tail only.
      b.resize(n);
      return b;
    }
  }
  return fresh_buffer(n);
}

void recycle_large_buffer(bytes&& b) noexcept {
  bytes dropped = std::move(b);
  const auto cap = dropped.capacity();
  if (cap < recycle_min_size)
    return;
  auto& c = the_cache();
  std::lock_guard lk(c.mutex);
  if (c.buffers.size() >= max_buffers || c.bytes_held + cap > max_bytes)
    return; // freed after the lock is released (`dropped` is declared before it)
  c.bytes_held += cap;
  try {
    c.buffers.push_back(std::move(dropped));
  } catch (...) {
    c.bytes_held -= cap;
  }
}

} // namespace corodist::net::detail
