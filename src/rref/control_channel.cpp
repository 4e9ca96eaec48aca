#include "rref/control_channel.hpp"

#include <corodist/core/error.hpp>
#include <corodist/rpc/codec.hpp>

#include "core/log.hpp"

#include <algorithm>

namespace corodist::rref::detail {

const char* name(control c) noexcept {
  switch (c) {
  case control::ack: return "ACK";
  case control::fork_request: return "FORK_REQUEST";
  case control::fork_confirm: return "FORK_CONFIRM";
  case control::child_accept: return "CHILD_ACCEPT";
  case control::user_delete: return "USER_DELETE";
  }
  return "?";
}

rpc::payload encode_control(std::uint64_t seq, const control_msg& m) {
  rpc::encoder e;
  auto& pk = e.packer();
  if (m.type == control::ack) {
    pk.pack_array(2);
    pk.pack(seq);
    pk.pack(static_cast<std::uint8_t>(control::ack));
  } else {
    pk.pack_array(7);
    pk.pack(seq);
    pk.pack(static_cast<std::uint8_t>(m.type));
    pk.pack(m.id.worker);
    pk.pack(m.id.local);
    pk.pack(m.fork.worker);
    pk.pack(m.fork.local);
    pk.pack(m.parent);
  }
  return e.finish();
}

std::pair<std::uint64_t, control_msg> decode_control(net::bytes&& frame) {
  rpc::codec_context ctx;
  auto p = rpc::parse_payload(std::move(frame), ctx);
  const auto& o = p.body.get();
  try {
    if (o.type != msgpack::type::ARRAY || (o.via.array.size != 2 && o.via.array.size != 7))
      throw protocol_error("a control message is [seq, type, ...]");
    const auto* a = o.via.array.ptr;
    control_msg m;
    const auto seq = a[0].as<std::uint64_t>();
    const auto type = a[1].as<std::uint8_t>();
    if (type > static_cast<std::uint8_t>(control::user_delete) || (type == 0) != (o.via.array.size == 2))
      throw protocol_error("unknown control message type " + std::to_string(type));
    m.type = static_cast<control>(type);
    if (o.via.array.size == 7) {
      m.id = {a[2].as<std::int32_t>(), a[3].as<std::uint64_t>()};
      m.fork = {a[4].as<std::int32_t>(), a[5].as<std::uint64_t>()};
      m.parent = a[6].as<std::int32_t>();
    }
    return {seq, m};
  } catch (const protocol_error&) {
    throw;
  } catch (const std::exception& e) {
    throw protocol_error(std::string("rref: malformed control message: ") + e.what());
  }
}

control_channel::control_channel(send_fn send, enable_options opts) : send_(std::move(send)), opts_(opts) {}

void control_channel::send(int to, const control_msg& m, clock::time_point now) {
  auto& p = out_[to];
  const auto seq = p.next_seq++;
  p.unacked.emplace(seq, outgoing{m, now + opts_.first_retry, opts_.first_retry, now});
  ++unacked_count_;
  send_(to, encode_control(seq, m));
}

std::optional<control_msg> control_channel::receive(int from, std::uint64_t seq, const control_msg& m) {
  if (m.type == control::ack) {
    auto it = out_.find(from);
    if (it != out_.end() && it->second.unacked.erase(seq)) {
      --unacked_count_;
      it->second.gave_up_logged = false;
    }
    return std::nullopt;
  }
  send_(from, encode_control(seq, control_msg{})); // every copy is acknowledged
  auto& in = in_[from];
  if (seq <= in.upto || in.above.count(seq))
    return std::nullopt; // a duplicate: processed already
  in.above.insert(seq);
  while (!in.above.empty() && *in.above.begin() == in.upto + 1) {
    in.above.erase(in.above.begin());
    ++in.upto;
  }
  return m;
}

void control_channel::pump(clock::time_point now) {
  for (auto& [to, p] : out_) {
    for (auto it = p.unacked.begin(); it != p.unacked.end();) {
      auto& o = it->second;
      const auto give_up = opts_.give_up_after.or_else(enable_options::default_give_up_after);
      if (give_up.is_finite() && now - o.first >= give_up.length()) {
        if (!p.gave_up_logged)
          CORODIST_LOG_WARN("rref: worker {} has acknowledged no control message for {}; giving up on them "
                            "(is it gone?)",
                            to, give_up.str());
        p.gave_up_logged = true;
        it = p.unacked.erase(it);
        --unacked_count_;
        continue;
      }
      if (o.next <= now) {
        CORODIST_LOG_TRACE("rref: resending {} #{} to worker {}", name(o.msg.type), it->first, to);
        send_(to, encode_control(it->first, o.msg));
        o.interval = std::min(o.interval * 2, opts_.max_retry_interval);
        o.next = now + o.interval;
      }
      ++it;
    }
  }
}

} // namespace corodist::rref::detail
