// The call check on Gloo: every rank's call header sent to every other rank
// ahead of the collective's data, and the comparison.
#include "collective/gloo/algorithms.hpp"
#include "collective/gloo/call_header.hpp"

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <fmt/format.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace corodist::collective::detail {

struct header_inbox {
  std::vector<checked_call> headers;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
};

std::shared_ptr<header_inbox> post_header_inbox(const std::shared_ptr<gloo::Context>& context, std::uint32_t tag) {
  auto& ctx = *context;
  auto inbox = std::make_shared<header_inbox>();
  inbox->headers.resize(static_cast<std::size_t>(ctx.size));
  inbox->buffer = ctx.createUnboundBuffer(inbox->headers.data(), sizeof(checked_call) * inbox->headers.size());
  const auto slot = gloo::Slot::build(header_slot_prefix, tag);
  for (int p = 0; p < ctx.size; ++p)
    if (p != ctx.rank)
      inbox->buffer->recv(p, slot, static_cast<std::size_t>(p) * sizeof(checked_call), sizeof(checked_call));
  return inbox;
}

struct header_outbox {
  checked_call header;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
};

std::shared_ptr<header_outbox> post_header_outbox(const std::shared_ptr<gloo::Context>& context,
                                                  const collective_call& call, std::uint64_t seq, std::uint32_t tag,
                                                  bool compare_sites) {
  auto& ctx = *context;
  auto outbox = std::make_shared<header_outbox>();
  outbox->header = checked_call_of(call, seq, compare_sites);
  outbox->buffer = ctx.createUnboundBuffer(&outbox->header, sizeof outbox->header);
  const auto slot = gloo::Slot::build(header_slot_prefix, tag);
  for (int p = 0; p < ctx.size; ++p)
    if (p != ctx.rank)
      outbox->buffer->send(p, slot);
  return outbox;
}

std::string check_call(const gloo_call& gc, header_inbox& inbox, header_outbox& outbox) {
  auto& ctx = *gc.context;
  const int n = ctx.size;
  for (int p = 0; p < n; ++p)
    if (p != ctx.rank)
      inbox.buffer->waitRecv(time_left(gc));
  for (int p = 0; p < n; ++p)
    if (p != ctx.rank)
      outbox.buffer->waitSend(time_left(gc));
  const auto& mine = outbox.header;
  for (int p = 0; p < n; ++p) {
    const auto& other = inbox.headers[static_cast<std::size_t>(p)];
    if (p == ctx.rank || same_checked_call(other, mine))
      continue;
    return checked_difference_text(ctx.rank, mine, p, other);
  }
  return {};
}

std::size_t pair_count(const collective_call& call, int peer, int size, bool out) {
  const auto p = static_cast<std::size_t>(peer);
  const auto n = static_cast<std::size_t>(size);
  if (call.kind == collective_kind::all_to_all)
    return call.tensors[(out ? n : 0) + p].count();
  const auto& splits = out ? call.out_splits : call.in_splits;
  return splits.empty() ? call.tensors[out ? 1 : 0].count() / n : splits[p];
}

std::string check_pairwise(const gloo_call& gc, const collective_call& call, std::uint32_t tag) {
  auto& ctx = *gc.context;
  const auto n = static_cast<std::size_t>(ctx.size);
  // Row r of `counts`: rank r's counts to each rank, then from each rank.
  std::vector<std::uint64_t> counts(n * 2 * n);
  const auto row = [&](std::size_t r) { return counts.data() + r * 2 * n; };
  for (std::size_t p = 0; p < n; ++p) {
    row(static_cast<std::size_t>(ctx.rank))[p] = pair_count(call, static_cast<int>(p), ctx.size, false);
    row(static_cast<std::size_t>(ctx.rank))[n + p] = pair_count(call, static_cast<int>(p), ctx.size, true);
  }
  const auto bytes = 2 * n * sizeof(std::uint64_t);
  auto buffer = ctx.createUnboundBuffer(counts.data(), counts.size() * sizeof(std::uint64_t));
  const auto slot = gloo::Slot::build(pairwise_slot_prefix, tag);
  for (int p = 0; p < ctx.size; ++p)
    if (p != ctx.rank) {
      buffer->recv(p, slot, static_cast<std::size_t>(p) * bytes, bytes);
      buffer->send(p, slot, static_cast<std::size_t>(ctx.rank) * bytes, bytes);
    }
  for (int p = 0; p < ctx.size; ++p)
    if (p != ctx.rank) {
      buffer->waitRecv(time_left(gc));
      buffer->waitSend(time_left(gc));
    }
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j)
      if (i != j && row(i)[j] != row(j)[n + i])
        return fmt::format("the ranks' calls differ: rank {} called {} sending {} elements to rank {}, rank {} "
                           "expects {} from rank {}",
                           i, to_string(call.kind), row(i)[j], j, j, row(j)[n + i], i);
  return {};
}

} // namespace corodist::collective::detail
