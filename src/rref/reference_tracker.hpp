#pragma once
// One worker's side of the RRef protocol (private): it tracks the references
// this worker owns and uses -- OwnerRRefs and the forks they know, UserRRefs
// (confirmed or pending), the forks this worker made that are not confirmed
// yet (pending children, G2) -- and runs the reliable control channel.
// It talks only to an rpc::message_port -- the agent's, or a simulated
// network's in tests/rref/ -- so the simulation runs this very code.
//
// Loop-affine state; the protocol interface's entry points may be called from
// any thread and post their state changes to the port's executor (a change is
// posted before the message that depends on it is sent, and the executor runs
// posts in order).

#include <corodist/rref/enable.hpp>
#include <corodist/rref/debug_info.hpp>
#include <corodist/rref/detail/protocol.hpp>

#include "rref/control_channel.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>

#include <corodist/core/io_registration.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace corodist::rref::detail {

/// Tests only: when set, a user that forks an RRef does not hold its own
/// UserRRef until the child is confirmed -- G2 broken on purpose, so that the
/// simulation shows its checks catch the bug. Never set outside tests.
extern std::atomic<bool> break_g2_for_tests;

/// Message kinds of the RRef protocol (outside rpc's range).
inline constexpr rpc::message_kind kind_remote = 0x0600;  ///< request: [R, F, fn, [args], timeout]
inline constexpr rpc::message_kind kind_fetch = 0x0601;   ///< request: [R] -> the value
inline constexpr rpc::message_kind kind_control = 0x0602; ///< one-way: control_channel frames

class reference_tracker final : public protocol, public std::enable_shared_from_this<reference_tracker> {
public:
  using clock = std::chrono::steady_clock;

  /// `agent` may be null (a simulated port). With `now` given (a simulated
  /// clock), retries are sent only when the caller calls pump(); otherwise a
  /// timer on the port's executor does it whenever a message awaits its ack.
  reference_tracker(rpc::message_port& port, rpc::agent* agent, enable_options opts,
                    std::function<clock::time_point()> now = {});
  ~reference_tracker() override;

  /// Registers the protocol's message handlers on the port (before it starts).
  void install();

  // ---- protocol ----
  rpc::message_port& port() override { return port_; }
  std::shared_ptr<const void> hold_port(std::string_view op) const override;
  int self() const override { return port_.self().rank; }
  rpc::agent* agent() override { return agent_; }
  corodist::timeout default_timeout() const override {
    return opts_.timeout.or_else(enable_options::default_timeout);
  }
  std::shared_ptr<handle> new_remote(int owner) override;
  void send_remote(const std::shared_ptr<handle>& h, std::string_view fn, rpc::payload call,
                   corodist::deadline by) override;
  std::shared_ptr<handle> new_owned(std::shared_ptr<value_slot> v) override;
  fork_info fork_to(const std::shared_ptr<handle>& h, int peer) override;
  std::shared_ptr<handle> adopt(const fork_info& f, int from) override;
  future<net::bytes> fetch(const std::shared_ptr<handle>& h, corodist::deadline by) override;
  std::shared_ptr<value_slot> local_slot(const handle& h) override;
  void released(const handle& h) noexcept override;

  /// Sends again the control messages that are due (loop only).
  void pump();
  /// Counts of what the protocol holds (loop only).
  debug_info info() const;
  /// The ids of the RRefs still held here, for a report (loop only).
  std::vector<std::string> alive() const;
  /// Graceful shutdown's step (loop only; PyTorch's delAllUsersAndUnforkedOwners):
  /// every UserRRef here is let go (whatever handles remain), then it waits, up
  /// to `budget`, until the protocol is settled (settled()). OwnerRRefs that only
  /// this worker's own handles hold are the application's: they are neither
  /// dropped nor waited for, and keep their value until their last handle goes.
  /// Returns false (after logging what is left, by RRefId) if the budget ran out.
  asio::awaitable<bool> drain(corodist::deadline by);
  /// True when no UserRRef, pending child or unacknowledged control message is
  /// left here and no OwnerRRef here is known to another worker (loop only).
  bool settled() const noexcept;
  /// True when settled() and no OwnerRRef is left either (loop only).
  bool empty() const noexcept;
  /// True if this worker holds the OwnerRRef `id` with its value (loop only; the simulation's checks).
  bool holds_value(rref_id id) const;

private:
  struct owner_extra; // the rarely used parts of an OwnerRRef
  struct local_fetch; // a to_here() on the owner waiting for the value
  struct owner_entry {
    std::vector<fork_id> forks;   // UserRRefs elsewhere that this owner knows
    std::uint32_t local_refs = 0; // live handles here
    std::shared_ptr<value_slot> value; // null until its function finished
    std::unique_ptr<owner_extra> extra;  // waiting fetches, a failure
  };
  struct user_entry {
    rref_id id;
    std::int32_t owner = -1;
    std::int32_t parent = -1; // who forked it to us (-2: we created it by remote())
    std::uint32_t pending_children = 0;
    bool confirmed = false;
    bool handle_alive = true;
    std::weak_ptr<handle> h;
  };
  struct pending_child {
    rref_id id;
    fork_id parent_fork;
  };

  global_id next_id() { return {self(), next_local_.fetch_add(1, std::memory_order_relaxed)}; }
  /// Runs `f` on the loop, if this context still exists then.
  void post(corodist::unique_function<void(reference_tracker&)> f);
  void send_control(int to, const control_msg& m);
  void on_control(const rpc::inbound_message& m);
  void process(int from, const control_msg& m);
  void on_remote(rpc::inbound_message&& m, rpc::responder&& r);
  void on_fetch(rpc::inbound_message&& m, rpc::responder&& r);
  void remote_done(rref_id id, std::shared_ptr<value_slot> value, std::exception_ptr failure);
  void creation_acked(fork_id f, const std::string& what, std::exception_ptr failure);
  /// "RRef R{0, 1} owned by 'w1'": how errors name the RRef of `h`.
  std::string describe(const handle& h) const;
  void answer(owner_entry& e, rpc::responder&& r, int to);
  owner_entry& owner_of(rref_id id);
  void maybe_delete_owner(rref_id id);
  void maybe_delete_user(fork_id f);
  void arm_retry();
  /// Wakes a drain() waiting for the protocol to settle, once it has.
  void wake_drain();
  /// Fails the to_here() calls on the owner whose deadline passed (`fetch_timer_`).
  void arm_fetch_timer(clock::time_point deadline);
  void expire_local_fetches();

  rpc::message_port& port_;
  std::weak_ptr<const void> port_life_; // the port's owner (empty: a simulated port)
  bool port_tracked_ = false;           // port_life_ was set: lock it before using port_ off the loop
  rpc::agent* agent_;
  enable_options opts_;
  std::function<clock::time_point()> now_;
  asio::any_io_executor ex_;
  std::atomic<std::uint64_t> next_local_{1};
  control_channel channel_;

  // (loop only)
  std::unordered_map<rref_id, owner_entry, global_id_hash> owners_;
  std::unordered_map<fork_id, user_entry, global_id_hash> users_;
  std::unordered_map<fork_id, pending_child, global_id_hash> children_;
  asio::steady_timer* drain_wait_ = nullptr; // drain()'s wait while it runs
  std::unique_ptr<asio::steady_timer> retry_timer_; // real clock only; armed while messages await acks
  bool retry_armed_ = false;
  std::unique_ptr<asio::steady_timer> fetch_timer_; // real clock only; armed while a local to_here waits
  bool fetch_armed_ = false;
  std::optional<corodist::io_registration> registration_; // drops the timer at the context's shutdown
};

} // namespace corodist::rref::detail
