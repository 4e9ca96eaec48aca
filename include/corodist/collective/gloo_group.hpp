#pragma once
/// \file
/// corodist::collective::gloo_group: the Gloo backend (CPU buffers, TCP),
/// rendezvous through a corodist store, optionally joining a PyTorch job.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <corodist/collective/process_group.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/store/store.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace corodist::collective {

/// How a gloo_group joins a process group that PyTorch 1.13 ranks create with
/// `torch.distributed.init_process_group("gloo", ...)`: PyTorch's store keys,
/// its barrier and sequence-number steps, and its tags. The store must be the
/// job's (a `store::tcp_store` with `wire_protocol::pytorch_1_13` to PyTorch's
/// TCPStore master, or to a `store_server`, which also serves PyTorch's clients).
struct pytorch_options {
  static constexpr const char* default_store_prefix = "default_pg";

  /// PyTorch's group number: 0 for the default group (init_process_group),
  /// 1, 2, ... for the groups made by `new_group` in creation order (counted
  /// on every rank of the job, members of the group or not).
  int group_index = 0;
  /// The number of ranks in the job, which PyTorch's store-based barrier
  /// after creating a group counts (members and non-members of a `new_group`
  /// alike). 0: the group's size (a group of every rank). `new_group` over a
  /// subset sets it (see collective::new_group).
  int world_size = 0;
  /// The prefix PyTorch puts before every key of its groups: "default_pg"
  /// when the PyTorch ranks passed `init_method` (a URL or env://), "" when
  /// they passed `store=`.
  std::string store_prefix = default_store_prefix;
};

/// Settings of a gloo_group. Defaults are the named constants.
struct gloo_options {
  static constexpr std::chrono::milliseconds default_timeout = std::chrono::minutes(30);
  static constexpr const char* default_prefix = "corodist/pg";
  static constexpr std::size_t default_bucket_bytes = std::size_t{32} << 20;
  static constexpr std::size_t default_bcube_max_bytes = std::size_t{1} << 20;
  static constexpr int default_threads = 2;
  static constexpr std::chrono::milliseconds default_mismatch_probe_delay = std::chrono::seconds(1);

  /// Key prefix of this group in the store ("<prefix>/..."): groups that share
  /// a store need distinct prefixes (reusing one is detected and refused).
  /// Ignored with `pytorch` (PyTorch's layout is used).
  std::string prefix = default_prefix;
  /// Time limit of creation, and the default one of each collective (as
  /// PyTorch's 30 min; `inherit()`: default_timeout). Must be a positive
  /// length: `never()` is refused (Gloo's transport needs a finite one).
  corodist::timeout timeout = default_timeout;
  /// Address or host name the group's TCP device listens on, which peers
  /// connect to. Empty: the interface named by `interface` or $GLOO_SOCKET_IFNAME,
  /// else this machine's host name if it resolves to a local address, else 127.0.0.1.
  std::string host;
  /// Network interface to listen on (e.g. "eth0"), used when `host` is empty.
  std::string interface;
  /// Communication threads running Gloo calls. Collectives start in issue
  /// order; consecutive ones go to different threads and may overlap. Two, as
  /// PyTorch: with one, a collective that starts while Gloo still releases
  /// the previous one's buffers can stall Gloo's event loop until the next
  /// scheduler tick on a busy machine (bench/README.md).
  int threads = default_threads;
  /// A communication thread polls for the next collective this long before
  /// sleeping (saves a thread wake-up between back-to-back collectives).
  std::chrono::microseconds spin{0};
  /// Before each collective the ranks exchange a small header (sequence
  /// number, kind, dtype, sizes, reduction, root, call site) and fail with a
  /// `collective_error` naming both calls when they differ, before any data
  /// moves: the group stays usable. Without it, calls that differ stall (the
  /// ranks exchange no data) until `mismatch_probe_delay` finds them, and the
  /// group is aborted. Off by default: it costs one small message round per
  /// collective, a quarter to nine tenths of an allreduce up to 1 MiB on this
  /// project's 2-vCPU VM (docs/collective.md). Setting
  /// CORODIST_CHECK_COLLECTIVES=1 in the environment turns it on for every
  /// group. Not available with `pytorch` (PyTorch's ranks send no headers).
  bool check_calls = false;
  /// With `check_calls`, the header also carries a digest of the call site
  /// (call_options::where): ranks that reach the same-shaped collective from
  /// different source lines fail with a `collective_error` naming both
  /// ranks' collective numbers and call sites ("rank 0 called allreduce #2
  /// (float32 x 4, sum) at train.cpp:42, rank 2 called allreduce #2 (float32
  /// x 4, sum) at train.cpp:57"): a rank that skipped one of two such calls is
  /// caught at the call, not at the deadline. Turn it off in a program whose
  /// ranks reach one collective from different lines on purpose (rank 0 in
  /// an `if` branch of its own); a rank with it off is compared by shape only.
  bool compare_call_sites = true;
  /// A collective still running after this long has its call compared,
  /// through the store, with the other stalled ranks' calls of the same
  /// collective (again after twice as long, and so on): if they differ, it
  /// fails with a `collective_error` naming both calls and the group is
  /// aborted. A collective that ends sooner costs nothing (no message, no
  /// store operation). Zero: never compare (a mismatch then stalls until the
  /// deadline). With `check_calls`, which finds calls that differ before any
  /// data moves, it finds only the same call made on ranks whose options
  /// send it as other messages (`bcube_max_bytes`, `bucket_bytes`). Unused
  /// with `pytorch` (PyTorch's ranks stay as they are). The same rhythm logs
  /// a warning naming the ranks not arrived (through this process's
  /// store::debug_responder, when it has one), and the probe's
  /// "<prefix>/waiting/<rank>" keys let a collective's timeout name the ranks
  /// not in it (docs/collective.md, "Debugging a hang"); zero turns both off.
  std::chrono::milliseconds mismatch_probe_delay = default_mismatch_probe_delay;
  /// Allreduces of at most this many bytes use Gloo's bcube algorithm
  /// (recursive halving/doubling: log2(size) exchanges each way, the fewest
  /// messages and thread wake-ups); larger ones the ring (PyTorch's choice,
  /// whose pipelined segments keep the links busy). 0: always the ring.
  /// Ignored with `pytorch` (the ring, as PyTorch's ranks run).
  std::size_t bcube_max_bytes = default_bcube_max_bytes;
  /// Coalesced collectives pack buffers of one dtype into staging buffers of
  /// at most this many bytes (a larger buffer goes alone, in place).
  std::size_t bucket_bytes = default_bucket_bytes;
  /// Join a PyTorch job's gloo process group (see pytorch_options).
  std::optional<pytorch_options> pytorch;
};

/// A process group on Gloo's TCP transport, for buffers in host memory — and
/// in CUDA device memory, staged through host memory as PyTorch's
/// ProcessGroupGloo does (so that ranks sharing one GPU, which NCCL refuses,
/// can run CUDA code): at the call, the buffers are copied to page-locked host
/// buffers on the group's stream of their device, after the work queued on
/// `call_options::stream` (the legacy default stream unless given); the
/// communication thread waits for those copies, runs Gloo on the host copies,
/// copies the results back and waits for them, and then completes the work
/// (the loop never waits on the GPU). The buffers of one call are on one
/// device. A CUDA failure, or CUDA unusable here, throws `cuda_error` at the
/// call (nothing issued) or fails the collective with `collective_error`.
///
/// Threading: Gloo's calls block their thread, so every collective runs on
/// the group's own communication thread(s); an event loop is never blocked.
/// Completion resumes an awaiting coroutine on its own executor (a plain
/// thread wakes from `work::get`). A watchdog thread enforces the deadlines:
/// a collective still running at its deadline fails with
/// `collective_timeout_error` and aborts the group (every connection is
/// closed, so that peers fail promptly too); so does a failed peer
/// connection (a rank killed), with `collective_error`. Calls that differ
/// between ranks exchange no data (each collective's Gloo tag carries a
/// digest of the call): they stall until the watchdog, after
/// `gloo_options::mismatch_probe_delay`, has the ranks compare them through
/// the store; they then fail with `collective_error` naming both calls, and
/// the group is aborted (with `check_calls`, before any data moves, and the
/// group stays usable).
/// Rendezvous: each rank publishes its address under the group's prefix in
/// the store (through an adapter of Gloo's rendezvous store) and connects to
/// every other rank.
/// Lost ranks: over a store with owned keys (a tcp_store, or a prefix_store
/// over one), each rank also publishes "<prefix>/member/<rank>" with
/// `store::set_owned` and watches its peers': a rank whose process dies or
/// whose store connection passes the server's heartbeat deadline (a hung
/// rank) fails every pending and later collective with `rank_lost_error`
/// naming it (docs/collective.md, "Lost ranks"). Other stores publish none.
class gloo_group final : public process_group {
public:
  /// True when this build has the Gloo backend (else `create` throws `usage_error`).
  static bool built() noexcept;

  /// Creates rank `rank` of a group of `size` ranks that meet in `store`;
  /// returns once every rank has connected to every other. Throws `usage_error` for bad
  /// arguments or a prefix already used on this store, `timeout_error` naming
  /// the ranks that never arrived within `opts.timeout`, `collective_error`
  /// if connecting fails. The group keeps `store` alive.
  /// Cancellation: terminal (the awaiting coroutine's, see docs/core.md) at
  /// its store operations: ends with `operation_aborted`, no group; while the
  /// ranks connect (Gloo's connect on the group's thread) it is not
  /// cancellable and the cancellation takes effect when that step ends
  /// (within `opts.timeout`). Keys it wrote stay in the store; the other
  /// ranks' create fails at their timeout.
  /// (Name the options first: `gloo_options o; ...; co_await create(s, r, n, o)`.
  /// GCC 12 destroys a braced aggregate temporary inside `co_await` twice.)
  [[nodiscard]] static asio::awaitable<std::shared_ptr<gloo_group>> create(std::shared_ptr<store::store> store,
                                                                          int rank, int size, gloo_options opts);

  /// As above with default options.
  [[nodiscard]] static asio::awaitable<std::shared_ptr<gloo_group>> create(std::shared_ptr<store::store> store,
                                                                          int rank, int size);

  /// Rendezvous at `url` (`env://`, `tcp://HOST:PORT?rank=R&world_size=W`,
  /// `file:///PATH?...`; see store::async_rendezvous) on `ex`, then `create`.
  /// A job this process has joined already (an rpc::agent's `init_method`)
  /// is not joined again: the group shares that rendezvous' store.
  /// Cancellation: as store::async_rendezvous, then as create.
  [[nodiscard]] static asio::awaitable<std::shared_ptr<gloo_group>> create(asio::any_io_executor ex, std::string url,
                                                                          gloo_options opts);

  /// As above with default options.
  [[nodiscard]] static asio::awaitable<std::shared_ptr<gloo_group>> create(asio::any_io_executor ex, std::string url);

  /// Blocking `create` for plain threads (throws `usage_error` on a loop thread).
  static std::shared_ptr<gloo_group> create_sync(std::shared_ptr<store::store> store, int rank, int size,
                                                 gloo_options opts = {});

  /// Blocking rendezvous + `create` on the running `loop`, for plain threads.
  static std::shared_ptr<gloo_group> create_sync(event_loop& loop, std::string_view url, gloo_options opts = {});

  /// Aborts what is in flight (it fails with `collective_error`) and joins
  /// the group's threads.
  ~gloo_group() override;

  std::string_view backend() const noexcept override { return "gloo"; }
  std::uint64_t sequence_number() const noexcept override;
  void abort(const std::string& reason) override;
  bool aborted() const noexcept override;

  /// Splits the group (process_group::split): the ranks exchange (color,
  /// key) with an allgather over this group, then the ranks of each color
  /// create a gloo_group over this group's store, under the prefix
  /// "<prefix()>/<opts.name, or split<n> for this group's n-th split>/<color>",
  /// with this group's options but `opts.timeout` (`inherit()`: this
  /// group's timeout). Throws `usage_error` for a color below 0 other than
  /// `no_color`, or on a group joined to a PyTorch job (PyTorch has no split:
  /// use collective::new_group there); otherwise as the allgather (this
  /// group's errors) and `create`.
  /// Cancellation: as the allgather, then as `create`.
  [[nodiscard]] asio::awaitable<std::shared_ptr<process_group>> split(int color, int key,
                                                                     split_options opts) override;
  using process_group::split;

  /// True when the group joined a PyTorch job (gloo_options::pytorch).
  bool joins_pytorch() const noexcept;

  /// PyTorch 1.13's `torch.distributed.new_group(ranks)` on a group that
  /// joined a PyTorch job's default group (PyTorch group 0): every rank of
  /// the job calls it, in the same order as the PyTorch ranks call
  /// new_group; the next PyTorch group number is taken (counted here from 1
  /// on every rank, members or not), the members connect under PyTorch's
  /// keys, and every rank runs PyTorch's store-based barrier. `ranks` sorted
  /// and checked (collective::new_group does both). Returns null on a rank
  /// not in `ranks`. Throws `usage_error` on a group that did not join a
  /// PyTorch job's default group; otherwise as `create`.
  /// Cancellation: as `create`.
  [[nodiscard]] asio::awaitable<std::shared_ptr<gloo_group>> pytorch_new_group(std::vector<int> ranks,
                                                                              split_options opts);

  /// The key prefix of the group in its store.
  const std::string& prefix() const noexcept;

  /// The address this rank's TCP device listens on.
  std::string address() const;

protected:
  work submit(collective_call call) override;

private:
  struct impl;
  gloo_group(int rank, int size, corodist::timeout timeout, std::unique_ptr<impl> i);

  std::unique_ptr<impl> impl_;
  /// Splits made so far (names "split<n>"); every rank splits in the same order.
  std::atomic<int> splits_{0};
  /// PyTorch groups made by pytorch_new_group so far (PyTorch's `_group_count` - 1).
  std::atomic<int> pytorch_groups_{0};
};

} // namespace corodist::collective
