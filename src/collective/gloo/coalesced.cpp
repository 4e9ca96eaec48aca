// Coalesced calls on Gloo (allreduce_coalesced, broadcast_coalesced): buffers
// grouped by dtype (in order of first appearance), packed into staging buckets
// of at most bucket_bytes; a bucket of one buffer runs in place. Every rank
// makes the same buckets from the same layout.
#include "collective/gloo/algorithms.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

namespace corodist::collective::detail {

namespace {

template <typename Run>
void coalesced(const gloo_call& gc, const std::vector<tensor_view>& ts, bool copy_back_on_root_too,
               int root, Run run) {
  std::vector<dtype> order;
  for (const auto& t : ts)
    if (std::find(order.begin(), order.end(), t.type()) == order.end())
      order.push_back(t.type());
  std::vector<std::byte> staging;
  std::vector<const tensor_view*> bucket;
  std::size_t bucket_bytes = 0;
  auto flush = [&] {
    if (bucket.empty())
      return;
    if (bucket.size() == 1) {
      run(*bucket[0]);
    } else {
      const auto type = bucket[0]->type();
      staging.resize(bucket_bytes);
      std::size_t off = 0;
      for (auto* t : bucket) {
        std::memcpy(staging.data() + off, t->data(), t->bytes());
        off += t->bytes();
      }
      run(tensor_view(staging.data(), bucket_bytes / element_size(type), type));
      if (copy_back_on_root_too || gc.context->rank != root) {
        off = 0;
        for (auto* t : bucket) {
          std::memcpy(t->data(), staging.data() + off, t->bytes());
          off += t->bytes();
        }
      }
    }
    bucket.clear();
    bucket_bytes = 0;
  };
  for (auto type : order) {
    for (const auto& t : ts) {
      if (t.type() != type || t.count() == 0)
        continue;
      if (!bucket.empty() && bucket_bytes + t.bytes() > gc.bucket_bytes)
        flush();
      bucket.push_back(&t);
      bucket_bytes += t.bytes();
    }
    flush();
  }
}

} // namespace

void allreduce_coalesced(const gloo_call& gc, const std::vector<tensor_view>& ts, reduce_op op) {
  coalesced(gc, ts, true, -1, [&](const tensor_view& t) { allreduce_one(gc, t, op); });
}

void broadcast_coalesced(const gloo_call& gc, const std::vector<tensor_view>& ts, int root) {
  coalesced(gc, ts, false, root, [&](const tensor_view& t) { broadcast_one(gc, t, root); });
}

} // namespace corodist::collective::detail
