// A collective's entry in its group's flight recorder.
#include "collective/record_call.hpp"

#include "collective/describe.hpp"

#include <iterator>

namespace corodist::collective::detail {

std::string group_peers(int size) {
  return size == 1 ? std::string("rank 0") : fmt::format("ranks 0-{}", size - 1);
}

void site_to(fmt::memory_buffer& out, const std::source_location& where) {
  if (where.line() == 0)
    return;
  std::string_view file = where.file_name();
  if (const auto slash = file.rfind('/'); slash != std::string_view::npos)
    file.remove_prefix(slash + 1);
  fmt::format_to(std::back_inserter(out), "{}:{}", file, where.line());
}

std::string site_text(const std::source_location& where) {
  fmt::memory_buffer out;
  site_to(out, where);
  return fmt::to_string(out);
}

namespace {

// The point-to-point peers: "rank 1", "ranks 1, 2", "any rank".
void p2p_peers_to(fmt::memory_buffer& out, const collective_call& call) {
  if (call.p2p.size() == 1) {
    const int peer = call.p2p[0].peer;
    if (peer == any_source)
      fmt::format_to(std::back_inserter(out), "any rank");
    else
      fmt::format_to(std::back_inserter(out), "rank {}", peer);
    return;
  }
  fmt::format_to(std::back_inserter(out), "ranks ");
  for (std::size_t i = 0; i < call.p2p.size() && i < 8; ++i)
    fmt::format_to(std::back_inserter(out), "{}{}", i == 0 ? "" : ", ", call.p2p[i].peer);
  if (call.p2p.size() > 8)
    fmt::format_to(std::back_inserter(out), ", ...");
}

} // namespace

void record_call(work_state& state, const std::shared_ptr<flight_recorder>& recorder, const collective_call& call,
                 std::uint64_t seq, std::string_view peers) {
  if (!recorder)
    return;
  fmt::memory_buffer detail, site, p2p_peers;
  describe_args_to(detail, call);
  site_to(site, call.where);
  std::uint64_t bytes = 0;
  if (is_point_to_point(call.kind)) {
    p2p_peers_to(p2p_peers, call);
    peers = std::string_view(p2p_peers.data(), p2p_peers.size());
    for (const auto& o : call.p2p)
      bytes += o.tensor.bytes();
  } else {
    // The caller's buffers (an output's size, where there is one, is in the detail).
    const std::size_t inputs = call.kind == collective_kind::all_to_all ? call.tensors.size() / 2
                               : (call.kind == collective_kind::allreduce ||
                                  call.kind == collective_kind::broadcast || call.kind == collective_kind::reduce ||
                                  call.kind == collective_kind::allreduce_coalesced ||
                                  call.kind == collective_kind::broadcast_coalesced)
                                   ? call.tensors.size()
                                   : std::min<std::size_t>(call.tensors.size(), 1);
    for (std::size_t i = 0; i < inputs; ++i)
      bytes += call.tensors[i].bytes();
  }
  record_fields f;
  f.seq = seq;
  f.op = to_string(call.kind);
  f.detail = std::string_view(detail.data(), detail.size());
  f.peer = peers;
  f.where = std::string_view(site.data(), site.size());
  f.bytes = bytes;
  f.started = false;
  state.record(recorder, f);
}

} // namespace corodist::collective::detail
