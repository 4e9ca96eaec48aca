#pragma once
// The connections to peers (private). A logical channel between two workers is
// one TCP connection per direction: each worker sends its requests and
// notifications only on the connection it dialled (so two workers dialling each
// other at once both succeed), and serves what arrives on connections it
// accepted. A dialled connection's first frame says who dialled it.

#include <corodist/core/flight_recorder.hpp>
#include <corodist/core/unique_function.hpp>
#include <corodist/net/connection.hpp>
#include <corodist/rpc/message_port.hpp>

#include "rpc/outgoing_call.hpp"
#include "rpc/worker_registry.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/steady_timer.hpp>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace corodist::rpc::detail {

/// The first frame of a dialled connection: the dialler's rank (int32 LE)
/// then its worker name (the rest of the frame).
net::bytes encode_identity(const worker_info& self);
/// Its rank and name, or nullopt if the frame is not one (too short, a negative rank).
std::optional<std::pair<int, std::string>> decode_identity(const net::bytes& frame);

/// A call's flight-recorder entry, told its request id and flow
/// (call_flow.hpp) when the call is sent. No recorder: none.
/// `call`: the call's cancel handle (null: it cannot be cancelled).
struct call_link {
  std::shared_ptr<flight_recorder> recorder;
  flight_recorder::handle record = 0;
  std::shared_ptr<outgoing_call> call;
};

/// Loop-affine: every member runs on the agent's loop.
class channels : public std::enable_shared_from_this<channels> {
public:
  /// Receives each request or notification that arrives, with the sender's
  /// rank (-1) and worker name ("") as its connection's first frame gave them
  /// (a connection that did not identify itself: unknown). Known before this
  /// worker has the worker table: a peer may call while it still waits for it.
  using message_fn = std::function<void(int from, const std::string& from_name,
                                        const std::shared_ptr<net::connection>&, net::message&&)>;
  /// Completes a request: the response, or an error in it.
  using response_fn = corodist::unique_function<void(net::response&&)>;

  /// What a message of a kind is, for logs (the dispatcher's kind_name).
  using kind_name_fn = std::function<std::string(message_kind)>;

  channels(asio::any_io_executor ex, const worker_registry& registry, net::connection_options options,
           kind_name_fn kind_name, message_fn on_message);

  /// Why a peer counts as lost: its connection closed (or fell silent for
  /// peer_timeout) while the agent ran. Sticky: later requests fail at once.
  struct lost_peer {
    std::error_code ec;  // what requests to it fail with (connection_closed or peer_timed_out)
    std::string reason;  // for peer_lost_error
  };

  /// Sends a request to worker `rank`, dialling it first if no connection is
  /// open (calls queue behind one dial); to a lost peer it fails at once. `by` bounds the dial
  /// and the wait for the response together; a request still queued at its
  /// deadline fails with request_timeout. `done` runs on the loop, once.
  /// `link`: the entry to tell the request id when it is sent.
  void request(int rank, message_kind kind, payload p, corodist::deadline by, response_fn done,
               call_link link = {});

  /// Cancels the call of `call` (loop only): a request under way ends at once
  /// with operation_aborted and a kind_cancel frame follows it to the callee;
  /// one still queued for its connection ends when it would be sent; one
  /// finished is left alone.
  void cancel(outgoing_call& call);

  /// Sends a one-way message to worker `rank` (dialling as request() does).
  /// Returns false if it cannot be queued (closed).
  void notify(int rank, message_kind kind, payload p);

  /// Takes an accepted connection: serves what arrives on it.
  void adopt(std::shared_ptr<net::connection> conn);

  /// Closes every connection and fails what is queued (connection_closed);
  /// later requests fail at once. Idempotent.
  void close_all();

  /// Graceful shutdown began (a peer closes only once every worker is in it):
  /// peers closing their connections now is expected (still recorded, logged
  /// at debug only).
  void expect_peers_to_close() noexcept { peers_leaving_ = true; }

  /// Why worker `rank` is lost, or null while it is not.
  const lost_peer* lost(int rank) const;

  /// Where stream frames arriving on a connection this worker dialled go
  /// (`rank`: its peer), and who hears of any connection closing (accepted
  /// or dialled; `rank`: its peer, -1 unknown). Set before start.
  using stream_frame_fn = std::function<void(int rank, const std::shared_ptr<net::connection>&, net::message&&)>;
  using closed_fn = std::function<void(const net::connection*, int rank)>;
  void set_stream_hooks(stream_frame_fn frames, closed_fn closed) {
    stream_frames_ = std::move(frames);
    stream_closed_ = std::move(closed);
  }
  /// The open connection this worker dialled to `rank`, or null.
  std::shared_ptr<net::connection> connection_to(int rank) const;

  /// Peers this worker has an open connection to (tests, diagnostics).
  std::size_t dialled_peers() const;
  /// Connections accepted and open.
  std::size_t accepted() const noexcept { return incoming_.size(); }

private:
  // A message waiting for its peer's connection.
  struct waiting {
    message_kind kind = 0;
    payload body;
    std::chrono::steady_clock::time_point deadline; // max(): none
    response_fn done; // null: a notification
    call_link link;   // a recorded call's entry
    int rank = -1;    // the peer's
  };
  struct peer {
    std::shared_ptr<net::connection> conn;
    bool dialing = false;
    std::deque<waiting> queue;
    std::unique_ptr<asio::steady_timer> timer; // the earliest deadline in the queue
    std::optional<lost_peer> lost;
  };
  struct accepted_conn {
    std::weak_ptr<net::connection> conn;
    int rank = -1;
    std::string name; // the worker name the peer identified itself by
  };

  void send(const std::shared_ptr<net::connection>& conn, waiting&& w);
  asio::awaitable<void> dial(int rank);
  void arm_queue_timer(int rank);
  void expire_queued(int rank);
  void on_incoming(net::connection* raw, const std::shared_ptr<net::connection>& conn, net::message&& m);
  /// Records that worker `rank`'s connection closed with `reason` (unless the
  /// agent itself is closing).
  void mark_lost(int rank, std::error_code reason);

  asio::any_io_executor ex_;
  const worker_registry& registry_;
  net::connection_options options_;
  kind_name_fn kind_name_;
  message_fn on_message_;
  std::unordered_map<int, peer> peers_;
  std::unordered_map<net::connection*, accepted_conn> incoming_;
  bool closed_ = false;
  bool peers_leaving_ = false;
  stream_frame_fn stream_frames_;
  closed_fn stream_closed_;
};

} // namespace corodist::rpc::detail
