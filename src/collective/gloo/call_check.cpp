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
  std::vector<call_header> headers;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
};

std::shared_ptr<header_inbox> post_header_inbox(const std::shared_ptr<gloo::Context>& context, std::uint32_t tag) {
  auto& ctx = *context;
  auto inbox = std::make_shared<header_inbox>();
  inbox->headers.resize(static_cast<std::size_t>(ctx.size));
  inbox->buffer = ctx.createUnboundBuffer(inbox->headers.data(), sizeof(call_header) * inbox->headers.size());
  const auto slot = gloo::Slot::build(header_slot_prefix, tag);
  for (int p = 0; p < ctx.size; ++p)
    if (p != ctx.rank)
      inbox->buffer->recv(p, slot, static_cast<std::size_t>(p) * sizeof(call_header), sizeof(call_header));
  return inbox;
}

struct header_outbox {
  call_header header;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
};

std::shared_ptr<header_outbox> post_header_outbox(const std::shared_ptr<gloo::Context>& context,
                                                  const collective_call& call, std::uint64_t seq, std::uint32_t tag) {
  auto& ctx = *context;
  auto outbox = std::make_shared<header_outbox>();
  outbox->header = header_of(call, seq);
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
    if (p == ctx.rank || other == mine)
      continue;
    std::string text = fmt::format("the ranks' calls differ: rank {} called {}, rank {} called {}", ctx.rank,
                                   header_text(mine), p, header_text(other));
    if (other.seq != mine.seq)
      text += fmt::format(" (as its collective #{})", other.seq);
    return text;
  }
  return {};
}

} // namespace corodist::collective::detail
