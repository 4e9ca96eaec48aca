#include <corodist/ddp/bucket_layout.hpp>
#include <corodist/ddp/parameter.hpp>

#include <corodist/core/error.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

namespace corodist::ddp {

namespace cc = corodist::collective;

bucket_layout bucket_layout::compute(std::span<const parameter> params, std::span<const std::size_t> order,
                                     std::size_t first_cap_bytes, std::size_t cap_bytes) {
  const std::size_t n = params.size();
  std::vector<std::size_t> seq;
  if (order.empty()) {
    for (std::size_t i = n; i-- > 0;)
      seq.push_back(i);
  } else {
    if (order.size() != n)
      throw usage_error(fmt::format("bucket_layout: the order names {} parameters, not {}", order.size(), n));
    std::vector<char> seen(n, 0);
    for (auto i : order) {
      if (i >= n || seen[i])
        throw usage_error(fmt::format("bucket_layout: the order is not a permutation (parameter {})", i));
      seen[i] = 1;
    }
    seq.assign(order.begin(), order.end());
  }
  if (first_cap_bytes == 0 || cap_bytes == 0)
    throw usage_error("bucket_layout: bucket caps must be positive");

  // One open bucket per (dtype, device); each key's first bucket closes at the
  // first cap, later ones at the cap (PyTorch's per-key limit iterators).
  struct open_bucket {
    bucket b;
    std::size_t first_pos = 0; // position in seq of its first parameter
    bool first = true;         // still this key's first bucket
  };
  using key = std::pair<int, std::pair<int, int>>;
  std::map<key, open_bucket> open;
  std::vector<std::pair<std::size_t, bucket>> closed;
  for (std::size_t pos = 0; pos < seq.size(); ++pos) {
    const auto& p = params[seq[pos]];
    const key k{static_cast<int>(p.type), {static_cast<int>(p.where.kind), p.where.index}};
    auto [it, fresh] = open.try_emplace(k);
    auto& ob = it->second;
    if (ob.b.parameters.empty()) {
      ob.b.type = p.type;
      ob.b.where = p.where;
      ob.first_pos = pos;
    }
    ob.b.parameters.push_back(seq[pos]);
    ob.b.offsets.push_back(ob.b.count);
    ob.b.count += p.count;
    if (ob.b.bytes() >= (ob.first ? first_cap_bytes : cap_bytes)) {
      closed.emplace_back(ob.first_pos, std::move(ob.b));
      ob.b = bucket{};
      ob.first = false;
    }
  }
  for (auto& [k, ob] : open)
    if (!ob.b.parameters.empty())
      closed.emplace_back(ob.first_pos, std::move(ob.b));
  std::stable_sort(closed.begin(), closed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  bucket_layout out;
  for (auto& [pos, b] : closed)
    out.buckets.push_back(std::move(b));
  return out;
}

std::vector<std::size_t> bucket_layout::bucket_of(std::size_t parameter_count) const {
  std::vector<std::size_t> out(parameter_count, std::numeric_limits<std::size_t>::max());
  for (std::size_t b = 0; b < buckets.size(); ++b)
    for (auto p : buckets[b].parameters)
      if (p < parameter_count)
        out[p] = b;
  return out;
}

std::string bucket_layout::to_string() const {
  std::string s;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const auto& k = buckets[b];
    s += fmt::format("bucket {} ({} {}, {} params, {} B):", b, cc::to_string(k.type), k.where.to_string(),
                     k.parameters.size(), k.bytes());
    for (auto p : k.parameters)
      s += fmt::format(" {}", p);
    s += "\n";
  }
  return s;
}

} // namespace corodist::ddp
