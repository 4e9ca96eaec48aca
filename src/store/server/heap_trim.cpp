#include "store/server/heap_trim.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace corodist::store::detail {

bool trim_heap_after(std::size_t held_bytes) noexcept {
  if (held_bytes < heap_trim_after_bytes)
    return false;
#if defined(__GLIBC__)
  ::malloc_trim(0);
  return true;
#else
  return false;
#endif
}

} // namespace corodist::store::detail
