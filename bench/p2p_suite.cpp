/// \file
/// Suite `p2p`: Gloo point-to-point between 2 rank processes (forked from
/// this one) over loopback, 4 B to 64 MiB of uint8:
///   * pingpong_<size>: rank 0 `co_await pg->send(buf, 1)` then
///     `co_await pg->recv(buf, 1)` from a coroutine on its event loop, rank 1
///     the mirror; rank 0 times each round trip (p50 is the round trip; the
///     one-way figure is half of it, `one_way_p50_us`);
///   * stream_<size>: rank 0 sends `messages` buffers back to back, keeping
///     `window` sends in flight; rank 1 keeps `window` receives posted and
///     times its completions from the first to the last (as the raw bulk
///     transfer times first byte to last byte): one figure per block, the
///     time per message; GB/s = bytes / the median over blocks. In the same
///     blocks, the same stream on Gloo's unbound buffers of a context of the
///     rank's own, waited for on its plain thread (`bare_gbytes_per_s`).
/// Both are measured in turns, block by block on each size, against
///   * PyTorch 1.13's gloo (bench/torch_allreduce_peer.py --op p2p: the same
///     with dist.send/dist.recv, and dist.isend/dist.irecv for the stream's
///     window), when /usr/bin/python3 can import torch;
///   * the raw TCP floor of the same size, measured by the benchmark's own
///     process between the jobs' turns with the raw suite's code: the
///     blocking-socket ping-pong of `bytes` (raw_pingpong) and the bulk
///     transfer in `bytes` send() calls (raw_bulk).
/// The table's ratio is therefore ours over the raw floor of the same size
/// (p50 / raw round trip; GB/s / raw GB/s), not over the 64 B floor.

#include "harness.hpp"
#include "peers.hpp"
#include "process_resources.hpp"
#include "turn_jobs.hpp"

#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>

#if CORODIST_BENCH_GLOO
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#endif

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace corodist::bench {
namespace {

namespace cc = corodist::collective;
using clock_type = std::chrono::steady_clock;

constexpr const char* suite_name = "p2p suite";
// Debian's python3-torch runs only under /usr/bin/python3 (peers.cpp checks it).
constexpr const char* python = "/usr/bin/python3";

/// What a block runs (the command's `kind` word, also the peer's).
enum class mode : int { pingpong = 0, stream = 1 };

struct size_case {
  std::size_t bytes;
  int round_trips; ///< ping-pong: timed round trips per block
  int messages;    ///< stream: messages per block
};

struct plan {
  std::vector<size_case> sizes;
  int blocks; ///< turns per size, mode and job
  int warmup; ///< ping-pong: untimed round trips the first time a job sees a size
};

plan make_plan(bool quick) {
  if (quick)
    return {{{4, 100, 500}, {1 << 10, 100, 500}, {256 << 10, 30, 128}, {4 << 20, 4, 16}, {64 << 20, 1, 4}}, 2, 5};
  return {{{4, 300, 2000},
           {64, 300, 2000},
           {1 << 10, 300, 2000},
           {16 << 10, 200, 2000},
           {256 << 10, 100, 512},
           {1 << 20, 40, 128},
           {4 << 20, 12, 32},
           {16 << 20, 4, 12},
           {64 << 20, 2, 6}},
          6,
          10};
}

/// Sends (and receives) a stream keeps in flight: at most 16, at most 32 MiB
/// of them, at least 2.
int stream_window(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{32} << 20) / bytes, 2, 16));
}

std::string size_name(std::size_t bytes) {
  if (bytes >= (1 << 20))
    return fmt::format("{}MiB", bytes >> 20);
  if (bytes >= (1 << 10))
    return fmt::format("{}KiB", bytes >> 10);
  return fmt::format("{}B", bytes);
}

/// The command of one block: its words after "RUN", "<bytes> <iters> <warmup> <kind> <window>".
struct command {
  mode kind = mode::pingpong;
  std::size_t bytes = 0;
  int iters = 0;
  int warmup = 0;
  int window = 1;

  /// The words, as the jobs read them.
  std::string words() const {
    return fmt::format("{} {} {} {} {}", bytes, iters, warmup, static_cast<int>(kind), window);
  }
};

/// The ping-pong's variants (the peer's job has only its own, 0).
enum variant : int { v_ours = 0, v_plain = 1, v_bare = 2, variant_count = 3 };

/// Figures in microseconds of one (mode, size): "RESULT <kind> <bytes> <p50> <p99> <n> [<plain_p50>
/// <bare_p50>]" (the ping-pong's other variants; the peer writes none); and the voluntary context
/// switches of the ping-pong (each a thread that slept and had to be woken): every rank of a job
/// writes "SWITCHES <kind> <bytes> <variant> <switches> <round_trips>" (its process's, all threads,
/// during that many round trips, warm-ups included).
struct result {
  double p50_us = not_applicable;
  double p99_us = not_applicable;
  double samples = 0;
  double plain_p50_us = not_applicable;
  double bare_p50_us = not_applicable;
  double switches[variant_count] = {0, 0, 0};    ///< summed over the job's ranks
  double round_trips[variant_count] = {0, 0, 0}; ///< one rank's

  /// Wake-ups per round trip of `v`, both processes together; NaN when not counted.
  double wakeups_per_round_trip(int v) const {
    return round_trips[v] > 0 ? switches[v] / round_trips[v] : not_applicable;
  }
};
using results = std::map<std::pair<int, std::size_t>, result>;

void parse_results(const std::vector<std::string>& lines, results& out) {
  for (const auto& line : lines) {
    if (auto v = result_words(line); v && v->size() >= 5) {
      auto& r = out[{static_cast<int>((*v)[0]), static_cast<std::size_t>((*v)[1])}];
      r.p50_us = (*v)[2];
      r.p99_us = (*v)[3];
      r.samples = (*v)[4];
      if (v->size() >= 7) {
        r.plain_p50_us = (*v)[5];
        r.bare_p50_us = (*v)[6];
      }
    } else if (line.rfind("SWITCHES ", 0) == 0) {
      std::istringstream in(line.substr(9));
      int kind = 0, which = 0;
      std::size_t bytes = 0;
      double switches = 0, round_trips = 0;
      if (in >> kind >> bytes >> which >> switches >> round_trips && which >= 0 && which < variant_count) {
        auto& r = out[{kind, bytes}];
        r.switches[which] += switches;
        r.round_trips[which] = round_trips;
      }
    }
  }
}


#if CORODIST_BENCH_GLOO

/// One rank of our job: rank 0 reads "RUN <bytes> <iters> <warmup> <kind>
/// <window>" from `control` and passes it on (an untimed broadcast); each
/// block ends with a barrier, then rank 0 answers "DONE". At the end rank 0
/// writes the ping-pong results and rank 1 the stream's (each times its side).
///
/// The ping-pong also runs, in the same block and rotating which goes first,
///   * plain: the same group's send/recv waited for with `work::get()` from
///     the rank's plain thread (no event loop: the resumption's hop to the
///     loop's thread is gone);
///   * bare: Gloo's unbound buffers on a context of the rank's own (its own
///     connection), sent and received with `waitSend`/`waitRecv` on the
///     rank's plain thread, as ProcessGroupGloo's send/recv do under
///     PyTorch's dist.send/dist.recv (neither the point-to-point thread's hop
///     nor the loop's);
/// so that ours - plain is what resuming on the loop costs, plain - bare
/// what the group's point-to-point thread costs, and bare - raw what Gloo's
/// own event-loop thread and protocol cost (the row's overhead_pct is ours
/// over bare).
int rank_main(int rank, const std::string& dir, int control, int output) {
  event_loop loop;
  loop.start();
  cc::gloo_options o;
  o.host = "127.0.0.1";
  o.timeout = std::chrono::minutes(30); // includes the peer's turns
  auto pg = cc::gloo_group::create_sync(loop, fmt::format("file://{}/store?rank={}&world_size=2&timeout=300", dir, rank),
                                        o);
  // The bare Gloo context: its own connection, rendezvous through Gloo's file store.
  gloo::rendezvous::FileStore files(dir);
  gloo::rendezvous::PrefixStore keys("bare", files);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto bare = std::make_shared<gloo::rendezvous::Context>(rank, 2);
  bare->setTimeout(std::chrono::minutes(30));
  bare->connectFullMesh(keys, device);

  const int other = 1 - rank;
  std::optional<line_reader> commands;
  if (rank == 0) {
    commands.emplace(control, suite_name);
    write_line(output, "READY", suite_name);
  }
  struct figures {
    latency_recorder ours, plain, bare;
    int blocks = 0;
    long switches[variant_count] = {0, 0, 0};
    long round_trips = 0; // of each variant
  };
  std::map<std::pair<int, std::size_t>, figures> timed;
  std::vector<std::vector<std::uint8_t>> buffers;
  auto ex = loop.get_executor();
  for (;;) {
    std::int64_t cmd[6] = {0, 0, 0, 0, 0, 0}; // run?, bytes, iters, warmup, kind, window
    if (rank == 0) {
      auto line = commands->next(std::chrono::hours(1), "the benchmark");
      std::istringstream in(line.value_or("QUIT"));
      std::string word;
      in >> word;
      if (word == "RUN" && (in >> cmd[1] >> cmd[2] >> cmd[3] >> cmd[4] >> cmd[5]))
        cmd[0] = 1;
    }
    pg->broadcast(cc::tensor_view(cmd, 6, cc::dtype::int64), 0).get();
    if (cmd[0] == 0)
      break;
    const auto bytes = static_cast<std::size_t>(cmd[1]);
    const int iters = static_cast<int>(cmd[2]);
    const auto kind = static_cast<mode>(cmd[4]);
    const auto window = static_cast<std::size_t>(std::max<std::int64_t>(cmd[5], 1));
    auto [it, fresh] = timed.try_emplace({static_cast<int>(kind), bytes});
    auto& fig = it->second;
    if (buffers.size() != window || buffers.front().size() != bytes) {
      buffers.clear(); // the last size's buffers are done with
      buffers.assign(window, std::vector<std::uint8_t>(bytes, static_cast<std::uint8_t>(rank)));
    }
    const int warmup = fresh ? static_cast<int>(cmd[3]) : 0;
    auto view = [&](std::size_t i) { return cc::tensor_view(buffers[i % buffers.size()]); };
    if (kind == mode::pingpong) {
      // Rank 0 sends first and times the round trips.
      auto timed_loop = [&](latency_recorder& rec, auto&& round_trip) {
        for (int i = 0; i < warmup + iters; ++i) {
          const auto t0 = clock_type::now();
          round_trip();
          if (i >= warmup && rank == 0)
            rec.add(clock_type::now() - t0);
        }
      };
      auto ours = [&] {
        run_blocking(ex, [&]() -> asio::awaitable<void> {
          for (int i = 0; i < warmup + iters; ++i) {
            const auto t0 = clock_type::now();
            if (rank == 0) {
              co_await pg->send(view(0), other);
              co_await pg->recv(view(0), other);
            } else {
              co_await pg->recv(view(0), other);
              co_await pg->send(view(0), other);
            }
            if (i >= warmup && rank == 0)
              fig.ours.add(clock_type::now() - t0);
          }
        }());
      };
      auto plain = [&] {
        timed_loop(fig.plain, [&] {
          if (rank == 0) {
            pg->send(view(0), other).get();
            pg->recv(view(0), other).get();
          } else {
            pg->recv(view(0), other).get();
            pg->send(view(0), other).get();
          }
        });
      };
      auto direct = [&] {
        auto b = bare->createUnboundBuffer(buffers[0].data(), bytes);
        timed_loop(fig.bare, [&] {
          if (rank == 0) {
            b->send(other, 0);
            b->waitSend();
            b->recv(other, 0);
            b->waitRecv();
          } else {
            b->recv(other, 0);
            b->waitRecv();
            b->send(other, 0);
            b->waitSend();
          }
        });
      };
      const int first = fig.blocks++ % variant_count;
      for (int k = 0; k < variant_count; ++k) {
        const int v = (first + k) % variant_count;
        const auto before = voluntary_switches();
        switch (v) {
        case v_ours: ours(); break;
        case v_plain: plain(); break;
        default: direct(); break;
        }
        fig.switches[v] += voluntary_switches() - before;
      }
      fig.round_trips += warmup + iters;
    } else {
      // `window` in flight; a stream of `window` messages warms a new size up.
      auto ours = [&] {
        run_blocking(ex, [&]() -> asio::awaitable<void> {
          for (int pass = warmup > 0 ? 0 : 1; pass < 2; ++pass) {
            const int n = pass == 0 ? static_cast<int>(window) : iters;
            std::deque<cc::work> in_flight;
            clock_type::time_point first{};
            bool started = false;
            auto complete_oldest = [&]() -> asio::awaitable<void> {
              co_await std::move(in_flight.front());
              in_flight.pop_front();
              if (!started) {
                first = clock_type::now();
                started = true;
              }
            };
            for (int i = 0; i < n; ++i) {
              if (in_flight.size() == window)
                co_await complete_oldest();
              in_flight.push_back(rank == 0 ? pg->send(view(static_cast<std::size_t>(i)), other)
                                            : pg->recv(view(static_cast<std::size_t>(i)), other));
            }
            while (!in_flight.empty())
              co_await complete_oldest();
            if (pass == 1 && rank == 1 && n > 1) // the receiver times the stream
              fig.ours.add((clock_type::now() - first) / (n - 1));
          }
        }());
      };
      // The same stream on Gloo's unbound buffers, one per buffer, waited for in order on this thread.
      auto direct = [&] {
        std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> ubs;
        for (auto& b : buffers)
          ubs.push_back(bare->createUnboundBuffer(b.data(), bytes));
        for (int pass = warmup > 0 ? 0 : 1; pass < 2; ++pass) {
          const int n = pass == 0 ? static_cast<int>(window) : iters;
          int oldest = 0;
          clock_type::time_point first{};
          auto complete_oldest = [&] {
            auto& b = *ubs[static_cast<std::size_t>(oldest) % ubs.size()];
            rank == 0 ? b.waitSend() : b.waitRecv();
            if (oldest++ == 0)
              first = clock_type::now();
          };
          for (int i = 0; i < n; ++i) {
            if (i - oldest == static_cast<int>(window))
              complete_oldest();
            auto& b = *ubs[static_cast<std::size_t>(i) % ubs.size()];
            rank == 0 ? b.send(other, 1) : b.recv(other, 1);
          }
          while (oldest < n)
            complete_oldest();
          if (pass == 1 && rank == 1 && n > 1)
            fig.bare.add((clock_type::now() - first) / (n - 1));
        }
      };
      if (fig.blocks++ % 2 == 0) {
        ours();
        direct();
      } else {
        direct();
        ours();
      }
    }
    pg->barrier().get(); // both sides are done before the next job's turn
    if (rank == 0)
      write_line(output, "DONE", suite_name);
  }
  for (auto& [key, fig] : timed) {
    if (fig.ours.size() > 0)
      write_line(output,
                 fmt::format("RESULT {} {} {} {} {} {} {}", key.first, key.second, fig.ours.percentile(0.5),
                             fig.ours.percentile(0.99), fig.ours.size(), fig.plain.percentile(0.5),
                             fig.bare.percentile(0.5)),
                 suite_name);
    if (fig.round_trips > 0)
      for (int v = 0; v < variant_count; ++v)
        write_line(output,
                   fmt::format("SWITCHES {} {} {} {} {}", key.first, key.second, v, fig.switches[v], fig.round_trips),
                   suite_name);
  }
  pg->barrier().get();
  return 0;
}

#endif

/// Prints a `# p2p:` line to the table (between the rows).
void comment(context& ctx, const std::string& text) {
  if (ctx.status)
    ctx.status->pause();
  fmt::print(ctx.table_out, "# p2p: {}\n", text);
  std::fflush(ctx.table_out);
}

void run_p2p_suite(context& ctx) {
#if CORODIST_BENCH_GLOO
  const auto p = make_plan(ctx.quick);
  std::optional<std::string> no_peer;
  const auto script = bench_script("torch_allreduce_peer.py");
  if (!ctx.peers)
    no_peer = "skipped";
  else if (auto why = torch_unavailable())
    no_peer = *why;
  else if (script.empty())
    no_peer = "bench/torch_allreduce_peer.py not found";

  const auto started = clock_type::now();
  char tmpl[] = "/tmp/corodist_p2p_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr)
    throw std::runtime_error("p2p suite: mkdtemp failed");
  const std::string dir = tmpl;
  results ours, peer;
  std::map<std::pair<int, std::size_t>, latency_recorder> raw; // the raw floor's samples, same units
  // The raw ping-pong's voluntary context switches (this process: its two threads) and round trips, by size.
  std::map<std::size_t, std::pair<double, double>> raw_wakeups;
  try {
    if (ctx.status)
      ctx.status->note(no_peer ? "2 ranks" : "2 ranks taking turns with PyTorch's");
    auto our_job = fork_job(suite_name, "corodist's 2 ranks", 2,
                            [&](int r, int control, int output) { return rank_main(r, dir, control, output); });
    std::unique_ptr<turn_job> peer_job;
    if (!no_peer)
      peer_job = spawn_job(suite_name, "PyTorch's 2 ranks", {python, script, "--op", "p2p", "--ranks", "2"});
    our_job->ready();
    if (peer_job)
      peer_job->ready();
    for (const auto& c : p.sizes) {
      for (auto kind : {mode::pingpong, mode::stream}) {
        if (ctx.status)
          ctx.status->note(fmt::format("{} {}", kind == mode::pingpong ? "ping-pong" : "stream", size_name(c.bytes)));
        command cmd;
        cmd.kind = kind;
        cmd.bytes = c.bytes;
        cmd.iters = kind == mode::pingpong ? c.round_trips : c.messages;
        cmd.warmup = p.warmup;
        cmd.window = kind == mode::pingpong ? 1 : stream_window(c.bytes);
        auto& floor = raw[{static_cast<int>(kind), c.bytes}];
        // Turns: ours, the peer, the raw floor; the raw floor's turn is the same work in the same units.
        for (int b = 0; b < p.blocks; ++b) {
          our_job->run(cmd.words());
          if (peer_job)
            peer_job->run(cmd.words());
          if (kind == mode::pingpong) {
            const auto warm = static_cast<std::size_t>(b == 0 ? p.warmup : 1);
            const auto before = voluntary_switches();
            auto pp = raw_pingpong(c.bytes, warm, static_cast<std::size_t>(cmd.iters));
            auto& w = raw_wakeups[c.bytes];
            w.first += static_cast<double>(voluntary_switches() - before);
            w.second += static_cast<double>(warm + pp.round_trips);
            floor.add_all(pp.latency);
          } else {
            const auto bulk = raw_bulk(static_cast<std::uint64_t>(cmd.iters) * c.bytes, c.bytes);
            floor.add_us(static_cast<double>(c.bytes) / bulk.gbytes_per_s * 1e-3);
          }
        }
      }
    }
    parse_results(our_job->finish(), ours);
    if (peer_job)
      parse_results(peer_job->finish(), peer);
  } catch (...) {
    remove_tree(dir);
    throw;
  }
  remove_tree(dir);
  comment(ctx, fmt::format("2 rank processes, {} sizes, {} blocks per size and mode of ours, {} and the raw floor "
                           "in turns, {:.1f} s in all; pingpong p50 = the round trip (one way: half), ratio = p50 "
                           "over the raw ping-pong of the same size; stream GB/s over the raw bulk transfer in sends "
                           "of the same size",
                           p.sizes.size(), p.blocks, no_peer ? "no peer (" + *no_peer + ")" : "PyTorch's",
                           std::chrono::duration<double>(clock_type::now() - started).count()));
  for (auto kind : {mode::pingpong, mode::stream}) {
    for (const auto& c : p.sizes) {
      const std::pair<int, std::size_t> key{static_cast<int>(kind), c.bytes};
      auto it = ours.find(key);
      if (it == ours.end())
        throw std::runtime_error("p2p suite: no result for " + size_name(c.bytes));
      const auto& r = it->second;
      const auto& floor = raw[key];
      record rec;
      rec.suite = "p2p";
      // The run's 64 B floor and bulk figure, since raw_* are the same size's here (the plot's floor line).
      rec.extra = {{"bytes", static_cast<double>(c.bytes)},
                   {"samples", r.samples},
                   {"blocks", double(p.blocks)},
                   {"floor_p50_us", ctx.raw_p50_us},
                   {"floor_gbytes_per_s", ctx.raw_gbytes_per_s}};
      std::optional<result> theirs;
      if (auto q = peer.find(key); q != peer.end())
        theirs = q->second;
      peer_result torch;
      torch.name = "pytorch";
      if (kind == mode::pingpong) {
        rec.name = "pingpong_" + size_name(c.bytes);
        rec.p50_us = r.p50_us;
        rec.p99_us = r.p99_us;
        rec.raw_p50_us = floor.percentile(0.5);
        rec.extra.emplace_back("one_way_p50_us", r.p50_us / 2);
        rec.extra.emplace_back("raw_p99_us", floor.percentile(0.99));
        auto add = [&](const char* key, double v) {
          if (!std::isnan(v))
            rec.extra.emplace_back(key, v);
        };
        add("plain_p50_us", r.plain_p50_us);
        add("bare_p50_us", r.bare_p50_us);
        add("overhead_pct", (r.p50_us / r.bare_p50_us - 1.0) * 100.0);
        // Thread wake-ups per round trip, both sides together (voluntary context switches).
        add("wakeups_per_rt", r.wakeups_per_round_trip(v_ours));
        add("plain_wakeups_per_rt", r.wakeups_per_round_trip(v_plain));
        add("bare_wakeups_per_rt", r.wakeups_per_round_trip(v_bare));
        if (auto w = raw_wakeups.find(c.bytes); w != raw_wakeups.end() && w->second.second > 0)
          add("raw_wakeups_per_rt", w->second.first / w->second.second);
        if (theirs)
          add("peer_wakeups_per_rt", theirs->wakeups_per_round_trip(v_ours));
        if (theirs) {
          torch.p50_us = theirs->p50_us;
          rec.extra.emplace_back("peer_p99_us", theirs->p99_us);
        }
      } else {
        auto gbps = [&](double us_per_message) { return static_cast<double>(c.bytes) / us_per_message * 1e-3; };
        rec.name = "stream_" + size_name(c.bytes);
        rec.gbytes_per_s = gbps(r.p50_us);
        rec.raw_gbytes_per_s = gbps(floor.percentile(0.5));
        rec.extra.emplace_back("us_per_message", r.p50_us);
        if (!std::isnan(r.bare_p50_us)) {
          rec.extra.emplace_back("bare_us_per_message", r.bare_p50_us);
          rec.extra.emplace_back("bare_gbytes_per_s", gbps(r.bare_p50_us));
        }
        rec.extra.emplace_back("window", stream_window(c.bytes));
        rec.extra.emplace_back("messages", c.messages);
        if (theirs) {
          torch.gbytes_per_s = gbps(theirs->p50_us);
          rec.extra.emplace_back("peer_us_per_message", theirs->p50_us);
        }
      }
      rec.peers = {theirs ? torch : peer_result::missing("pytorch", no_peer.value_or("no result"))};
      ctx.report(std::move(rec));
    }
  }
#else
  record rec;
  rec.suite = "p2p";
  rec.name = "gloo (corodist-bench was built without Gloo)";
  ctx.report(std::move(rec));
#endif
}

const suite_registrar registrar("p2p", &run_p2p_suite, 51);

} // namespace
} // namespace corodist::bench
