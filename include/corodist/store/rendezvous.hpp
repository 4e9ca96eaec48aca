#pragma once
/// \file
/// corodist::store::rendezvous: ranks find each other and agree on a store
/// (c10d's init_method URLs: env://, tcp://, file://).

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <corodist/core/event_loop.hpp>
#include <corodist/net/tls.hpp>
#include <corodist/store/store.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace corodist::store {

/// Deadlines and credentials of a rendezvous.
struct rendezvous_options {
  /// How long to wait for the server and for all ranks (also the store's
  /// default timeout afterwards). A `timeout=SECONDS` URL parameter overrides
  /// it: a whole number of seconds from 1 to 31536000 (a year), so
  /// `timeout=600` is 10 minutes; any other value is a `store_error`.
  corodist::timeout timeout = default_timeout;
  /// Token for the store server. nullopt: CORODIST_AUTH_TOKEN if set.
  std::optional<std::string> auth_token;
  /// TLS for the store (rank 0's server and every rank's client). nullopt:
  /// from CORODIST_TLS_* (docs/tls.md).
  std::optional<net::tls_options> tls;
  /// env:// and tcp:// on rank 0: when its store goes (the last reference
  /// dropped off the loop thread), the server it hosts stays up until every
  /// other rank has disconnected, at most this long -- so that the other ranks'
  /// last requests (a final barrier's wait) do not meet a closed store.
  std::chrono::milliseconds host_linger = default_host_linger;

  static constexpr std::chrono::milliseconds default_host_linger{std::chrono::seconds(5)};
};

/// What a rendezvous yields: the shared store, this process's rank, the world size.
struct rendezvous_result {
  std::shared_ptr<corodist::store::store> store;
  int rank = 0;
  int world_size = 0;
};

/// Joins the job described by `url` and returns once all `world_size` ranks
/// have arrived:
/// * `env://` — MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the environment
///   (`?rank=&world_size=&master_addr=&master_port=` override them); under
///   Slurm's srun, when RANK and WORLD_SIZE are both absent, SLURM_PROCID and
///   SLURM_NTASKS, and when MASTER_ADDR is absent, the first host of
///   SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST); MASTER_PORT is required;
/// * `tcp://HOST:PORT?rank=R&world_size=W` (IPv6 as `[::1]`);
/// * `file:///PATH?rank=R&world_size=W` — a file_store on a shared file.
/// For env:// and tcp://, rank 0 hosts the store_server on HOST:PORT (bound to
/// that address only) and every rank connects to it with retries. Each rank
/// claims its key `corodist/rdzv/rank/R` with its process id and host.
/// Under a launcher that hosts the store (env:// with
/// TORCHELASTIC_USE_AGENT_STORE=True, as corodist-run and torchrun set it),
/// rank 0 connects as a client too; with CORODIST_GENERATION=G (corodist-run)
/// the returned store is a prefix_store on `corodist/gen/G`, and a worker of a
/// generation older than the job's (`corodist/run/generation`) is refused with
/// `store_error`; a worker restarted in place (same generation, a higher
/// TORCHELASTIC_RESTART_COUNT than its rank's claim) takes the claim over.
///
/// A process joins a job once: a later rendezvous of the same job in the
/// same process (env:// or tcp:// with the same HOST:PORT, or the same
/// file://, and the same rank and world size), from any thread or event loop,
/// returns the store of the first while that store is alive (waiting for the
/// first if it is still joining), with the first one's options. So an
/// `rpc::agent` with `init_method` and a `gloo_group` created from the same
/// URL share one rendezvous; passing one rendezvous' store to both
/// (`agent_options::store`, `gloo_group::create(store, ...)`) says so outright.
///
/// Throws `store_error` for a malformed URL or missing variable, and when the
/// rank is claimed already (naming both claimants: two processes started as
/// one rank, a store or file holding an earlier job's rendezvous, or this
/// process rejoining after releasing its store); `connection_error` when rank
/// 0 cannot host the store (naming a job of this process hosted there);
/// `timeout_error` saying how many ranks arrived and which never did. Logs a
/// warning after 5 s, then every 30 s, naming the ranks still missing (and,
/// for env://, where the store is).
///
/// Cancellation: terminal (the awaiting coroutine's, see docs/core.md),
/// through the connect and the store operations it awaits: ends with
/// `operation_aborted` (`std::system_error`). What it wrote stays in the
/// store (this rank's claim, its arrival count): the other ranks may count
/// this rank as arrived.
[[nodiscard]] asio::awaitable<rendezvous_result> async_rendezvous(asio::any_io_executor ex, std::string url,
                                                                  rendezvous_options opts);

/// As above with default options. Cancellation: as above.
[[nodiscard]] inline asio::awaitable<rendezvous_result> async_rendezvous(asio::any_io_executor ex, std::string url) {
  return async_rendezvous(std::move(ex), std::move(url), rendezvous_options{});
}

/// This process's rank among those on its machine: LOCAL_RANK (set by
/// corodist-run and torchrun), else SLURM_LOCALID when RANK/WORLD_SIZE are
/// absent and Slurm's are present; nullopt when neither applies. Throws
/// `store_error` when the value is not a non-negative integer or a Slurm
/// node list is malformed. Reads the environment; any thread.
std::optional<int> local_rank_from_env();

/// Blocking rendezvous on a running `loop` (from a plain thread).
rendezvous_result rendezvous(event_loop& loop, std::string_view url, rendezvous_options opts = {});

} // namespace corodist::store
