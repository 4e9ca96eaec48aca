#pragma once
// The fingerprint of a collective call, which ranks compare to find calls
// that differ: the header (kind, dtype, element counts, reduction, root), the
// algorithm facts that shape Gloo's messages besides it, their texts, and the
// digest of both that goes into the collective's Gloo tag.

#include <corodist/collective/process_group.hpp>

#include <cstdint>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>

namespace corodist::collective::detail {

/// FNV-1a, 64 bits, over 64-bit values (little-endian bytes).
class fnv1a {
public:
  void mix(std::uint64_t v) noexcept {
    for (int i = 0; i < 8; ++i) {
      hash_ ^= (v >> (8 * i)) & 0xff;
      hash_ *= 1099511628211ull;
    }
  }
  std::uint64_t value() const noexcept { return hash_; }
  /// The value folded to 24 bits (the free low bits of a Gloo slot).
  std::uint64_t low24() const noexcept { return (hash_ ^ (hash_ >> 24) ^ (hash_ >> 48)) & 0xffffff; }

private:
  std::uint64_t hash_ = 1469598103934665603ull;
};

/// A call as the ranks compare it; the call check sends it ahead of the
/// collective's data (inside a `checked_call`).
struct call_header {
  std::uint64_t seq = 0;
  std::uint8_t kind = 0;
  std::uint8_t type = 0;
  std::uint8_t op = 0;
  std::uint8_t pad = 0;
  std::int32_t root = 0;
  std::uint64_t count0 = 0; ///< elements of the (first) buffer
  std::uint64_t count1 = 0; ///< elements of the output (allgather, reduce_scatter) or number of buffers
  std::uint64_t digest = 0; ///< coalesced: FNV-1a of every buffer's (dtype, count)

  bool operator==(const call_header&) const = default;
};
static_assert(sizeof(call_header) == 40);

/// The header of `call`, collective number `seq`.
call_header header_of(const collective_call& call, std::uint64_t seq);

/// What the call check sends every other rank ahead of a collective's data
/// (88 bytes): the call's header and where the call was made, so that a rank
/// that reaches a collective from another source line (it skipped one of
/// two same-shaped collectives) is caught at the call.
struct checked_call {
  call_header header;
  /// Digest of the call site (file and line); 0: not compared (the rank's
  /// gloo_options::compare_call_sites is off, or the site is unknown).
  std::uint64_t site = 0;
  /// "train.cpp:42" (cut to fit, NUL-terminated), for the difference's text.
  char site_text[40] = {};
};
static_assert(sizeof(checked_call) == 88);

/// The checked call of `call` (collective `seq`); with `compare_sites` its
/// site digest is set.
checked_call checked_call_of(const collective_call& call, std::uint64_t seq, bool compare_sites);

/// True when the ranks made the same call: the headers are equal, and so are
/// the sites where both ranks compare them.
bool same_checked_call(const checked_call& a, const checked_call& b) noexcept;

/// "the ranks' calls differ: rank 0 called allreduce #2 (float32 x 4, sum) at
/// train.cpp:42, rank 2 called allreduce #2 (float32 x 4, sum) at train.cpp:57"
/// (`a` is rank `rank_a`'s call; each named as its rank numbered it).
std::string checked_difference_text(int rank_a, const checked_call& a, int rank_b, const checked_call& b);

/// True for calls whose ranks exchange counts that differ per pair
/// (all_to_all, uneven all_to_all_single): check_pairwise compares those.
bool per_peer(const collective_call& call) noexcept;

/// "allreduce(float32 x 1000, sum)", as describe() says it of the call.
std::string header_text(const call_header& h);

/// A call and the group options that decide its messages besides the header
/// (each field is zero where it decides nothing), as a stalled collective
/// publishes it for the stall probe.
struct call_record {
  call_header header;
  std::uint64_t bucket_bytes = 0;    ///< coalesced calls: gloo_options::bucket_bytes (the staging buckets)
  std::uint64_t bcube_max_bytes = 0; ///< allreduce_coalesced: gloo_options::bcube_max_bytes (each bucket's algorithm)
  std::int32_t rank = 0;             ///< the rank that made the call (not compared)
  std::uint8_t ring = 0;             ///< allreduce: 1 on Gloo's ring, 0 on bcube
  std::uint8_t pad[3] = {};

  /// The same call with the same messages (every field but `rank`).
  bool same_call(const call_record& other) const noexcept;
};
static_assert(sizeof(call_record) == 64);

/// "the ranks' calls differ: rank 0 called allreduce(float32 x 1000, sum),
/// rank 1 called allreduce(float32 x 999, sum)" (lower rank first; the
/// algorithm facts are named where only they differ).
std::string difference_text(const call_record& a, const call_record& b);

/// The record as bytes for the store, and back (nullopt: not a record).
std::string encode(const call_record& r);
std::optional<call_record> decode(std::string_view bytes);

/// Bits of a collective's Gloo tag that carry its sequence number; the other
/// 16 carry the digest of its record. Gloo delivers data only between
/// operations on the same slot (the prefix of Gloo's algorithm and the tag),
/// so ranks whose calls differ exchange no data: a mismatch stalls instead of
/// overflowing a receive (which ends the process on Gloo's event-loop
/// thread). The split: the collectives in flight at once on all ranks
/// together are at most threads x (size + 2) apart in number (a rank that has
/// not started collective s holds back every collective from s on, except
/// the broadcasts whose root has started it, and each root starts at most
/// `threads` that cannot complete), so 16 bits keep them apart up to
/// threads x (size + 2) = 65536 (32766 ranks with the default 2 threads);
/// 16 bits of digest leave two different calls the same tag with
/// probability 2^-16.
inline constexpr int tag_seq_bits = 16;

/// The 16-bit digest of `r`: every field but the sequence number and the rank.
std::uint16_t tag_digest(const call_record& r) noexcept;

/// The Gloo tag of collective `seq` whose record has digest `digest`.
constexpr std::uint32_t data_tag(std::uint64_t seq, std::uint16_t digest) noexcept {
  return (static_cast<std::uint32_t>(digest) << tag_seq_bits) |
         static_cast<std::uint32_t>(seq & ((std::uint64_t{1} << tag_seq_bits) - 1));
}

} // namespace corodist::collective::detail
