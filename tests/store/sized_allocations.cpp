#include "store/sized_allocations.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<std::size_t> watched_size{0};
std::atomic<std::size_t> watched_count{0};

void* counted(std::size_t n) {
  if (n != 0 && n == watched_size.load(std::memory_order_relaxed))
    watched_count.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n))
    return p;
  throw std::bad_alloc();
}
} // namespace

namespace corodist::test {
void count_allocations_of(std::size_t bytes) noexcept {
  watched_count = 0;
  watched_size = bytes;
}
std::size_t sized_allocations() noexcept { return watched_count.load(); }
} // namespace corodist::test

// Every allocation of the executable goes through these (aligned ones are left to the library).
void* operator new(std::size_t n) { return counted(n); }
void* operator new[](std::size_t n) { return counted(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
// The nothrow forms too (std::stable_sort's temporary buffer uses them): a
// replaced delete must never free what the library's new allocated.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
