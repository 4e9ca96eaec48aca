// The fingerprint of a collective call: its header, record, texts and digest.
#include "collective/gloo/call_header.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string_view>

namespace corodist::collective::detail {


call_header header_of(const collective_call& call, std::uint64_t seq) {
  call_header h;
  h.seq = seq;
  h.kind = static_cast<std::uint8_t>(call.kind);
  const bool reduces = call.kind == collective_kind::allreduce || call.kind == collective_kind::reduce_scatter ||
                       call.kind == collective_kind::allreduce_coalesced || call.kind == collective_kind::reduce;
  h.op = reduces ? static_cast<std::uint8_t>(call.op) : 0;
  const bool rooted = call.kind == collective_kind::broadcast || call.kind == collective_kind::broadcast_coalesced ||
                      call.kind == collective_kind::gather || call.kind == collective_kind::scatter ||
                      call.kind == collective_kind::reduce;
  h.root = rooted ? call.root : 0;
  switch (call.kind) {
  case collective_kind::allreduce:
  case collective_kind::broadcast:
    h.type = static_cast<std::uint8_t>(call.tensors[0].type());
    h.count0 = call.tensors[0].count();
    break;
  case collective_kind::allgather:
  case collective_kind::reduce_scatter:
    h.type = static_cast<std::uint8_t>(call.tensors[0].type());
    h.count0 = call.tensors[0].count();
    h.count1 = call.tensors[1].count();
    break;
  case collective_kind::barrier:
  case collective_kind::monitored_barrier:
  case collective_kind::send:
  case collective_kind::recv:
  case collective_kind::batch_isend_irecv:
    break;
  case collective_kind::reduce:
    h.type = static_cast<std::uint8_t>(call.tensors[0].type());
    h.count0 = call.tensors[0].count();
    break;
  case collective_kind::gather:
  case collective_kind::scatter: // the block each rank sends or receives
    h.type = static_cast<std::uint8_t>(call.tensors[0].type());
    h.count0 = call.tensors[call.kind == collective_kind::gather ? 0 : 1].count();
    break;
  case collective_kind::all_to_all_single:
  case collective_kind::all_to_all:
    // The counts each pair of ranks exchanges are compared by check_pairwise;
    // an even all_to_all_single compares its sizes here.
    h.type = static_cast<std::uint8_t>(call.tensors[0].type());
    if (call.kind == collective_kind::all_to_all_single && call.in_splits.empty() && call.out_splits.empty()) {
      h.count0 = call.tensors[0].count();
      h.count1 = call.tensors[1].count();
    }
    break;
  case collective_kind::allgatherv: {
    fnv1a hash;
    for (auto c : call.in_splits)
      hash.mix(c);
    h.type = static_cast<std::uint8_t>(call.tensors[0].type());
    h.count0 = call.tensors[1].count();
    h.count1 = call.in_splits.size();
    h.digest = hash.value();
    break;
  }
  case collective_kind::allreduce_coalesced:
  case collective_kind::broadcast_coalesced: {
    fnv1a hash;
    for (const auto& t : call.tensors) {
      hash.mix(static_cast<std::uint64_t>(t.type()));
      hash.mix(t.count());
      h.count0 += t.count();
    }
    h.count1 = call.tensors.size();
    h.digest = hash.value();
    break;
  }
  }
  return h;
}

std::string header_text(const call_header& h) {
  const auto kind = static_cast<collective_kind>(h.kind);
  const auto type = to_string(static_cast<dtype>(h.type));
  const auto op = to_string(static_cast<reduce_op>(h.op));
  std::string args;
  switch (kind) {
  case collective_kind::allreduce: args = fmt::format("{} x {}, {}", type, h.count0, op); break;
  case collective_kind::broadcast: args = fmt::format("{} x {}, root {}", type, h.count0, h.root); break;
  case collective_kind::allgather: args = fmt::format("in {} x {}, out {} x {}", type, h.count0, type, h.count1); break;
  case collective_kind::reduce_scatter:
    args = fmt::format("in {} x {}, out {} x {}, {}", type, h.count0, type, h.count1, op);
    break;
  case collective_kind::barrier:
  case collective_kind::monitored_barrier: break;
  case collective_kind::reduce: args = fmt::format("{} x {}, {}, root {}", type, h.count0, op, h.root); break;
  case collective_kind::gather: args = fmt::format("{} x {} per rank, root {}", type, h.count0, h.root); break;
  case collective_kind::scatter: args = fmt::format("{} x {} per rank, root {}", type, h.count0, h.root); break;
  case collective_kind::all_to_all_single:
  case collective_kind::all_to_all:
    if (h.count0 != 0 || h.count1 != 0)
      args = fmt::format("in {} x {}, out {} x {}", type, h.count0, type, h.count1);
    else
      args = fmt::format("{}, uneven", type);
    break;
  case collective_kind::allgatherv:
    args = fmt::format("{} x {} in all over {} counts, counts digest {:016x}", type, h.count0, h.count1, h.digest);
    break;
  case collective_kind::allreduce_coalesced:
  case collective_kind::broadcast_coalesced:
    args = fmt::format("{} buffers, {} elements in all, layout digest {:016x}, ", h.count1, h.count0, h.digest);
    args += kind == collective_kind::allreduce_coalesced ? std::string(op) : fmt::format("root {}", h.root);
    break;
  default: return fmt::format("an unknown collective (kind {})", h.kind);
  }
  return fmt::format("{}({})", to_string(kind), args);
}

checked_call checked_call_of(const collective_call& call, std::uint64_t seq, bool compare_sites) {
  checked_call c;
  c.header = header_of(call, seq);
  if (call.where.line() == 0)
    return c;
  std::string_view file = call.where.file_name();
  if (compare_sites) {
    fnv1a hash; // the path 8 bytes at a time
    for (std::size_t at = 0; at < file.size(); at += 8) {
      std::uint64_t word = 0;
      std::memcpy(&word, file.data() + at, std::min<std::size_t>(8, file.size() - at));
      hash.mix(word);
    }
    hash.mix(call.where.line());
    c.site = hash.value() | 1; // never 0 (not compared)
  }
  if (const auto slash = file.rfind('/'); slash != std::string_view::npos)
    file.remove_prefix(slash + 1);
  fmt::format_to_n(c.site_text, sizeof c.site_text - 1, "{}:{}", file, call.where.line());
  return c;
}

bool same_checked_call(const checked_call& a, const checked_call& b) noexcept {
  return a.header == b.header && (a.site == 0 || b.site == 0 || a.site == b.site);
}

namespace {

// "allreduce #2 (float32 x 4, sum) at train.cpp:42".
std::string numbered_text(const checked_call& c) {
  const auto text = header_text(c.header); // "allreduce(float32 x 4, sum)"
  const auto open = text.find('(');
  std::string named;
  if (open == std::string::npos || text.back() != ')')
    named = fmt::format("{} #{}", text, c.header.seq);
  else if (open + 2 == text.size()) // no arguments: "barrier #2"
    named = fmt::format("{} #{}", text.substr(0, open), c.header.seq);
  else
    named = fmt::format("{} #{} ({})", text.substr(0, open), c.header.seq,
                        std::string_view(text).substr(open + 1, text.size() - open - 2));
  const std::string_view site(c.site_text, ::strnlen(c.site_text, sizeof c.site_text));
  if (!site.empty())
    named += fmt::format(" at {}", site);
  return named;
}

} // namespace

std::string checked_difference_text(int rank_a, const checked_call& a, int rank_b, const checked_call& b) {
  return fmt::format("the ranks' calls differ: rank {} called {}, rank {} called {}", rank_a, numbered_text(a), rank_b,
                     numbered_text(b));
}

bool per_peer(const collective_call& call) noexcept {
  return call.kind == collective_kind::all_to_all ||
         (call.kind == collective_kind::all_to_all_single && (!call.in_splits.empty() || !call.out_splits.empty()));
}

bool call_record::same_call(const call_record& o) const noexcept {
  return header == o.header && bucket_bytes == o.bucket_bytes && bcube_max_bytes == o.bcube_max_bytes &&
         ring == o.ring;
}

namespace {

// The call, and (when `algorithm`) what decides its messages besides it.
std::string record_text(const call_record& r, bool algorithm) {
  auto text = header_text(r.header);
  if (!algorithm)
    return text;
  const auto kind = static_cast<collective_kind>(r.header.kind);
  if (kind == collective_kind::allreduce)
    return text + (r.ring ? " on the ring" : " on bcube");
  if (kind == collective_kind::allreduce_coalesced)
    return text + fmt::format(" with bucket_bytes {}, bcube_max_bytes {}", r.bucket_bytes, r.bcube_max_bytes);
  return text + fmt::format(" with bucket_bytes {}", r.bucket_bytes);
}

} // namespace

std::string difference_text(const call_record& a, const call_record& b) {
  const auto& lo = a.rank <= b.rank ? a : b;
  const auto& hi = a.rank <= b.rank ? b : a;
  const bool options_only = lo.header == hi.header; // the same call on differently set groups
  auto text = fmt::format("the ranks' calls differ: rank {} called {}, rank {} called {}", lo.rank,
                          record_text(lo, options_only), hi.rank, record_text(hi, options_only));
  if (options_only)
    text += " (their gloo_options differ)";
  return text;
}

std::string encode(const call_record& r) {
  std::string bytes(sizeof r, '\0');
  std::memcpy(bytes.data(), &r, sizeof r);
  return bytes;
}

std::optional<call_record> decode(std::string_view bytes) {
  if (bytes.size() != sizeof(call_record))
    return std::nullopt;
  call_record r;
  std::memcpy(&r, bytes.data(), sizeof r);
  return r;
}

std::uint16_t tag_digest(const call_record& r) noexcept {
  fnv1a hash;
  const auto& h = r.header;
  hash.mix(h.kind | std::uint64_t{h.type} << 8 | std::uint64_t{h.op} << 16 |
           std::uint64_t{static_cast<std::uint32_t>(h.root)} << 32);
  hash.mix(h.count0);
  hash.mix(h.count1);
  hash.mix(h.digest);
  hash.mix(r.bucket_bytes);
  hash.mix(r.bcube_max_bytes);
  hash.mix(r.ring);
  const auto v = hash.value();
  return static_cast<std::uint16_t>(v ^ (v >> 16) ^ (v >> 32) ^ (v >> 48));
}

} // namespace corodist::collective::detail
