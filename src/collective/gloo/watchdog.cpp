// A gloo_group's watchdog and abort: the thread that fails collectives at
// their deadlines, and aborting, which ends the group's connections so that
// every blocked Gloo call, here and on the peers, fails at once.
#include "collective/gloo/gloo_group_impl.hpp"

#include "collective/gloo/mesh_context.hpp"
#include "collective/gloo/socket_shutdown.hpp"
#include "core/log.hpp"

#include <gloo/transport/tcp/address.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>

namespace corodist::collective {

std::string gloo_group::impl::reason() const {
  std::lock_guard lk(mutex);
  return abort_reason;
}

void gloo_group::impl::rank_lost(int lost, const std::string& why) {
  abort(fmt::format("rank {} lost: {}", lost, why), lost);
}

void gloo_group::impl::abort_if_lost_while_idle(std::unique_lock<std::mutex>& lk) {
  if (idle_lost < 0 || aborted)
    return;
  const int lost = idle_lost;
  const auto why = idle_lost_why;
  lk.unlock();
  rank_lost(lost, why);
  lk.lock();
}

void gloo_group::impl::member_lost(int lost, const std::string& why) {
  {
    std::lock_guard lk(mutex);
    if (aborted)
      return;
    const bool pending =
        !p2p_queue.empty() ||
        std::any_of(inflight.begin(), inflight.end(), [](const auto& e) { return !e.second->state->completed(); });
    if (!pending) {
      if (idle_lost < 0) {
        idle_lost = lost;
        idle_lost_why = why;
        CORODIST_LOG_DEBUG("{} (rank {}): rank {}'s member key vanished with no collective pending; the next one "
                           "fails",
                           label, rank, lost);
      }
      return;
    }
  }
  rank_lost(lost, why);
}

void gloo_group::impl::abort(const std::string& why, int lost) {
  {
    std::lock_guard lk(mutex);
    if (aborted)
      return;
    aborted = true;
    abort_reason = why;
    lost_rank = lost;
    aborted_flag.store(true, std::memory_order_release);
  }
  watchdog_cv.notify_all();
  finished_cv.notify_all();
  CORODIST_LOG_WARN("{} (rank {} of {}) aborted: {}", label, rank, size, why);
  signal_pairs("corodist: " + why);
}

std::exception_ptr gloo_group::impl::aborted_error(const pending_op& op) const {
  std::string why;
  int lost;
  {
    std::lock_guard lk(mutex);
    why = abort_reason;
    lost = lost_rank;
  }
  if (lost < 0)
    return std::make_exception_ptr(error_of(op, "the group was aborted: " + why));
  return std::make_exception_ptr(rank_lost_error(where(op) + ": " + why + "; the group is aborted", lost,
                                                 std::string(to_string(op.call.kind)), rank, op.seq));
}

int gloo_group::impl::peer_named(const char* what) const {
  // Gloo's pair errors name the peer's listening address: "Connection closed
  // by peer [127.0.0.1]:40123", "Read error [127.0.0.1]:40123: ...".
  const std::string text(what);
  for (std::size_t i = 0; i < remote_ends.size(); ++i) {
    const auto addr = gloo::transport::tcp::Address(remote_ends[i]).str();
    for (auto at = text.find(addr); at != std::string::npos; at = text.find(addr, at + 1)) {
      const auto end = at + addr.size();
      if (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end])))
        continue; // a longer port
      const int peer = static_cast<int>(i);
      return peer >= rank ? peer + 1 : peer; // remote_ends skips this rank
    }
  }
  return -1;
}

std::optional<std::pair<int, std::string>> gloo_group::impl::lost_peer(const char* what) {
  if (!members)
    return std::nullopt;
  const int peer = peer_named(what);
  const auto lost = members->missing(peer, member_poll_limit);
  if (!lost)
    return std::nullopt;
  if (*lost != peer)
    return std::pair(*lost, std::string("its member key vanished (connection to the store lost)"));
  const bool reset = std::strstr(what, "reset") != nullptr;
  return std::pair(*lost, std::string(reset ? "connection reset" : "connection closed"));
}

// Ends every connection of the group: our blocked Gloo calls fail (Gloo's
// event loop sees the connections end), and so do the peers'. Gloo tells
// only some of the waiting buffers that their pair failed (abortable_device.hpp),
// so every buffer is failed too.
void gloo_group::impl::signal_pairs(const std::string& why) {
  if (!connected.load(std::memory_order_acquire))
    return;
  const auto n = detail::shutdown_sockets(local_ends, remote_ends);
  device->fail_buffers(why);
  CORODIST_LOG_DEBUG("{} (rank {}): shut down {} connection(s): {}", label, rank, n, why);
}

// Each pair's own listening address, and each peer's for this pair.
void gloo_group::impl::record_endpoints(const detail::mesh_context& mesh) {
  for (int i = 0; i < size; ++i) {
    if (i == rank)
      continue;
    local_ends.push_back(gloo::transport::tcp::Address(context->getPair(i)->address().bytes()).getSockaddr());
    remote_ends.push_back(gloo::transport::tcp::Address(mesh.peer_address(i)).getSockaddr());
  }
}

// Aborts the group when the earliest deadline of a collective in flight
// passes (Gloo's own per-call timeouts cover a running call; this also
// covers calls queued behind a long one). With the stall probe, it also
// looks at what is in flight every mismatch_probe_delay.
void gloo_group::impl::watch() {
  std::unique_lock lk(mutex);
  while (!stopping) {
    if (aborted) { // nothing left to time: in-flight calls fail promptly now
      watchdog_wakes_at = clock::time_point::min();
      watchdog_cv.wait(lk, [&] { return stopping; });
      break;
    }
    const auto now = clock::now();
    auto next = clock::time_point::max();
    std::shared_ptr<pending_op> first;
    for (const auto& [seq, op] : inflight)
      if (op->deadline < next && !op->state->completed()) {
        next = op->deadline;
        first = op;
      }
    if (first && now >= next) {
      lk.unlock();
      abort(timeout_texts(*first).second); // (reads the store: not under the lock)
      first.reset();
      lk.lock();
      continue;
    }
    if (probe) {
      // While the group is busy, look again after a probe delay; once it has
      // been idle since the last look (nothing in flight, nothing issued),
      // park: the next collective issued wakes the watchdog. (Parking
      // whenever nothing happens to be in flight would make back-to-back
      // collectives wake it one after another.)
      watchdog_parked = inflight.empty() && next_seq == seq_at_last_look;
      seq_at_last_look = next_seq;
      if (!watchdog_parked) {
        warn_stalled(now);
        probe_stalled(now);
        next = std::min(next, now + opts.mismatch_probe_delay);
      }
    }
    // With nothing earlier in flight, sleep one group timeout: a collective
    // issued meanwhile with the default timeout is due later, so issuing
    // it wakes no one; only a shorter per-call deadline does (or, with the
    // stall probe, the first one issued while the watchdog is parked).
    if (next == clock::time_point::max())
      next = now + opts.timeout.length();
    watchdog_wakes_at = next;
    watchdog_cv.wait_until(lk, next);
  }
}

void gloo_group::impl::shutdown() noexcept {
  if (probe)
    probe->detach(); // no report into a group being destroyed
  if (members)
    members->detach();
  bool busy;
  {
    std::lock_guard lk(mutex);
    // (A collective completes its work just before it leaves `inflight`.)
    busy = !p2p_queue.empty() ||
           std::any_of(inflight.begin(), inflight.end(), [](const auto& e) { return !e.second->state->completed(); });
  }
  if (busy)
    abort("the group was destroyed with collectives in flight");
  {
    std::lock_guard lk(mutex);
    stopping = true;
  }
  watchdog_cv.notify_all();
  if (watchdog.joinable())
    watchdog.join();
  if (comm)
    comm->stop(); // queued collectives fail fast (aborted) or finish
  if (p2p_waiter)
    p2p_waiter->stop(); // after an abort, every wait fails at once
}

} // namespace corodist::collective
