// monitored_barrier on Gloo: every rank reports to rank 0, which waits for
// each until the arrival deadline and then sends every rank that arrived the
// verdict (one byte per rank: 1 = did not arrive), so that all of them can
// name the missing ranks.
#include "collective/gloo/algorithms.hpp"

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cstdint>
#include <memory>
#include <vector>

namespace corodist::collective::detail {

std::vector<int> monitored_barrier(const gloo_call& gc, std::chrono::steady_clock::time_point arrive_by) {
  auto& ctx = *gc.context;
  const auto n = static_cast<std::size_t>(ctx.size);
  const auto arrive = static_cast<std::uint64_t>(gloo::Slot::build(monitor_slot_prefix, gc.tag));
  const auto verdict_slot = arrive + 1;
  // (kept: after a timeout Gloo still holds the receives of the missing ranks
  // until the group is aborted.)
  auto& verdict = kept<std::vector<std::uint8_t>>(gc, n, std::uint8_t{0});
  if (ctx.rank != 0) {
    auto& hello = kept<std::uint8_t>(gc, std::uint8_t{1});
    auto& out = kept<std::unique_ptr<gloo::transport::UnboundBuffer>>(gc, ctx.createUnboundBuffer(&hello, 1));
    auto& in = kept<std::unique_ptr<gloo::transport::UnboundBuffer>>(gc, ctx.createUnboundBuffer(verdict.data(), n));
    in->recv(0, verdict_slot);
    out->send(0, arrive);
    out->waitSend(time_left(gc));
    in->waitRecv(time_left(gc));
  } else {
    // One buffer receives every rank's hello, a byte at the rank's offset;
    // each wait returns at the next arrival (Gloo remembers only the last
    // sender, so the bytes say who came). At `arrive_by` an alarm ends the
    // wait (a Gloo wait that times out closes the group's connections instead).
    auto& hellos = kept<std::vector<std::uint8_t>>(gc, n, std::uint8_t{0});
    auto& in = kept<std::unique_ptr<gloo::transport::UnboundBuffer>>(gc, ctx.createUnboundBuffer(hellos.data(), n));
    for (int p = 1; p < ctx.size; ++p)
      in->recv(p, arrive, static_cast<std::size_t>(p), 1);
    std::mutex m;
    std::condition_variable cv;
    bool finished = false;
    std::thread alarm([&] {
      std::unique_lock lk(m);
      if (!cv.wait_until(lk, arrive_by, [&] { return finished; }))
        in->abortWaitRecv();
    });
    auto stop_alarm = [&] {
      {
        std::lock_guard lk(m);
        finished = true;
      }
      cv.notify_all();
      alarm.join();
    };
    try {
      for (int k = 1; k < ctx.size; ++k)
        if (!in->waitRecv(time_left(gc)))
          break; // the alarm: some did not arrive in time
    } catch (...) {
      stop_alarm();
      throw;
    }
    stop_alarm();
    {
      std::lock_guard lk(m); // (orders the reads after the waits)
      for (std::size_t p = 1; p < n; ++p)
        verdict[p] = hellos[p] != 0 ? 0 : 1;
    }
    auto& out = kept<std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>>(gc);
    for (int p = 1; p < ctx.size; ++p)
      if (verdict[static_cast<std::size_t>(p)] == 0) {
        out.push_back(ctx.createUnboundBuffer(verdict.data(), n));
        out.back()->send(p, verdict_slot);
      }
    for (auto& b : out)
      b->waitSend(time_left(gc));
  }
  std::vector<int> missing;
  for (std::size_t p = 0; p < n; ++p)
    if (verdict[p] != 0)
      missing.push_back(static_cast<int>(p));
  return missing;
}

} // namespace corodist::collective::detail
