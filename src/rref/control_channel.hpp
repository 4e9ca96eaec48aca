#pragma once
// The RRef protocol's control messages and how they travel (private): one-way
// notifications made reliable and exactly-once over a network that may delay,
// reorder, duplicate and drop them. Each message to a worker gets the next
// sequence number; the receiver acknowledges every copy it gets and processes
// only the first; the sender sends again, with backoff, until acknowledged, and
// gives up on a worker that has not acknowledged anything for `give_up_after`.
// Loop-affine; time comes from the caller (real or simulated).

#include <corodist/rpc/payload.hpp>
#include <corodist/rref/enable.hpp>
#include <corodist/rref/rref_id.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

namespace corodist::rref::detail {

/// The protocol's control messages (which guarantee each serves: docs/rref.md).
enum class control : std::uint8_t {
  ack = 0,          ///< transport: "I got your message `seq`"
  fork_request = 1, ///< child -> owner: confirm my fork (G2)
  fork_confirm = 2, ///< owner -> child: I know your fork
  child_accept = 3, ///< child -> parent: the owner knows me, let your fork go (G2)
  user_delete = 4,  ///< user -> owner: my UserRRef is gone (G1)
};

/// The name of a control message type (logs).
const char* name(control c) noexcept;

/// One control message: its type, the RRef, the fork it is about, and the
/// parent worker (fork_request only).
struct control_msg {
  control type = control::ack;
  rref_id id;
  fork_id fork;
  std::int32_t parent = -1;
};

/// Encodes a control frame `[seq, type, Rw, Rl, Fw, Fl, parent]` (an ack: `[seq, 0]`).
rpc::payload encode_control(std::uint64_t seq, const control_msg& m);
/// Decodes one; throws protocol_error if malformed.
std::pair<std::uint64_t, control_msg> decode_control(net::bytes&& frame);

class control_channel {
public:
  using clock = std::chrono::steady_clock;
  /// Hands a frame to the network (the port's notify).
  using send_fn = std::function<void(int to, rpc::payload)>;

  control_channel(send_fn send, enable_options opts);

  /// Sends `m` to worker `to` until it is acknowledged.
  void send(int to, const control_msg& m, clock::time_point now);

  /// A frame arrived from `from`: acknowledges it (every copy), and returns the
  /// message if this is its first copy; an ack settles the message it names.
  std::optional<control_msg> receive(int from, std::uint64_t seq, const control_msg& m);

  /// Sends again what is due; gives up on workers silent for too long.
  void pump(clock::time_point now);

  /// Messages sent and not yet acknowledged.
  std::size_t unacked() const noexcept { return unacked_count_; }

private:
  struct outgoing {
    control_msg msg;
    clock::time_point next;
    std::chrono::milliseconds interval;
    clock::time_point first;
  };
  struct peer_out {
    std::uint64_t next_seq = 1;
    std::map<std::uint64_t, outgoing> unacked;
    bool gave_up_logged = false;
  };
  struct peer_in {
    std::uint64_t upto = 0;          // every seq up to this one was processed
    std::set<std::uint64_t> above;   // processed ones above it (out of order)
  };

  send_fn send_;
  enable_options opts_;
  std::unordered_map<int, peer_out> out_;
  std::unordered_map<int, peer_in> in_;
  std::size_t unacked_count_ = 0;
};

} // namespace corodist::rref::detail
