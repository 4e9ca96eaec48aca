#include <corodist/core/error.hpp>
#include <corodist/store/errors.hpp>
#include <corodist/store/debug_responder.hpp>
#include <corodist/store/file_store.hpp>
#include <corodist/store/prefix_store.hpp>
#include <corodist/store/rendezvous.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>

#include "core/linger.hpp"
#include "core/log.hpp"
#include "store/client/connect_retry.hpp"
#include "store/rendezvous/joined_jobs.hpp"
#include "store/rendezvous/launch_env.hpp"
#include "store/wait_log.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <corodist/core/run_blocking.hpp>

#include <atomic>
#include <charconv>
#include <cstdlib>
#include <map>

namespace corodist::store {

namespace {

struct parsed_url {
  std::string scheme;
  std::string host;
  std::string port;
  std::string path;
  std::map<std::string, std::string> query;
};

[[noreturn]] void bad_url(const std::string& url, const std::string& why) {
  throw store_error("rendezvous: bad URL '" + url + "': " + why);
}

parsed_url parse(const std::string& url) {
  parsed_url u;
  auto sep = url.find("://");
  if (sep == std::string::npos)
    bad_url(url, "expected scheme://...");
  u.scheme = url.substr(0, sep);
  std::string rest = url.substr(sep + 3);
  if (auto q = rest.find('?'); q != std::string::npos) {
    std::string query = rest.substr(q + 1);
    rest.resize(q);
    std::size_t pos = 0;
    while (pos <= query.size()) {
      auto amp = query.find('&', pos);
      auto item = query.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
      if (!item.empty()) {
        auto eq = item.find('=');
        if (eq == std::string::npos)
          bad_url(url, "query item '" + item + "' has no '='");
        u.query[item.substr(0, eq)] = item.substr(eq + 1);
      }
      if (amp == std::string::npos)
        break;
      pos = amp + 1;
    }
  }
  if (u.scheme == "file") {
    u.path = rest;
    return u;
  }
  if (!rest.empty() && rest.back() == '/')
    rest.pop_back();
  if (!rest.empty() && rest.front() == '[') { // [v6]:port
    auto close = rest.find(']');
    if (close == std::string::npos)
      bad_url(url, "unterminated '[' in host");
    u.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':')
      u.port = rest.substr(close + 2);
  } else if (auto colon = rest.rfind(':'); colon != std::string::npos) {
    u.host = rest.substr(0, colon);
    u.port = rest.substr(colon + 1);
  } else {
    u.host = rest;
  }
  return u;
}

long to_int(const std::string& url, const std::string& what, const std::string& text) {
  long v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size())
    bad_url(url, what + " '" + text + "' is not an integer");
  return v;
}

// The `timeout=SECONDS` parameter: a whole, positive number of seconds.
std::chrono::milliseconds timeout_seconds(const std::string& url, const std::string& text) {
  constexpr long max_seconds = 365L * 24 * 3600;
  long v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size() || v <= 0 || v > max_seconds)
    bad_url(url, "timeout '" + text + "' is not a whole number of seconds between 1 and " +
                     std::to_string(max_seconds) + " (the unit of timeout= is the second: timeout=600 is 10 minutes)");
  return std::chrono::seconds(v);
}

// The value of a URL parameter, else (env:// only) of the launcher's variable
// `env_name`, read into `from_env` with its Slurm fallback (`slurm_name`).
std::string setting(const parsed_url& u, const std::string& url, const char* param,
                    const std::optional<std::string>& from_env, const char* env_name, const char* slurm_name) {
  if (auto it = u.query.find(param); it != u.query.end())
    return it->second;
  if (u.scheme == "env" && from_env)
    return *from_env;
  std::string hint;
  if (u.scheme == "env") {
    hint = std::string(" (or $") + env_name;
    if (slurm_name)
      hint += std::string(", or under Slurm $") + slurm_name;
    hint += ")";
  }
  bad_url(url, std::string("missing ") + param + hint);
}

constexpr const char* rdzv = "corodist/rdzv/";
// Naming the missing ranks lists every rank's key: above this world size only
// rank 0 does it for its progress warnings (the others give the count).
constexpr int name_missing_up_to = 1024;

struct arrivals {
  int count = 0;
  std::string missing; // "1, 2" (at most 32 named), empty when not looked up
};

// Who has arrived, from the ranks' keys.
asio::awaitable<arrivals> look_up_arrivals(store& s, int world) {
  auto present = co_await s.list_keys(std::string(rdzv) + "rank/");
  std::vector<bool> seen(static_cast<std::size_t>(world));
  for (auto& k : present) {
    auto r = std::atoi(k.c_str() + std::char_traits<char>::length(rdzv) + 5);
    if (r >= 0 && r < world)
      seen[static_cast<std::size_t>(r)] = true;
  }
  arrivals a;
  int n_missing = 0;
  for (int r = 0; r < world; ++r) {
    if (seen[static_cast<std::size_t>(r)]) {
      ++a.count;
      continue;
    }
    if (++n_missing <= 32)
      a.missing += (a.missing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (n_missing > 32)
    a.missing += ", ... (" + std::to_string(n_missing) + " in all)";
  co_return a;
}

// What a rank's key holds: who claimed the rank, unique per rendezvous of a
// process ("pid 4242 on node1, rendezvous 1").
std::string claimant() {
  static std::atomic<unsigned> joins{0};
  return detail::this_process() + ", rendezvous " + std::to_string(++joins);
}

// The restart count in a claim ("..., restart 2"), -1 when it has none.
long restart_of(const std::string& claim) {
  constexpr std::string_view tag = ", restart ";
  auto at = claim.rfind(tag);
  if (at == std::string::npos)
    return -1;
  long v = -1;
  auto first = claim.data() + at + tag.size();
  auto [p, ec] = std::from_chars(first, claim.data() + claim.size(), v);
  return ec == std::errc{} && p == claim.data() + claim.size() ? v : -1;
}

// Why a rank cannot join: its key names another claim, `holder`.
[[noreturn]] void claimed_twice(const std::string& url, const std::string& where, int rank, const std::string& holder,
                                const std::string& me) {
  const bool file = url.starts_with("file://");
  const std::string fresh_file = "a file:// rendezvous needs a fresh file for each job (remove the file, or name a "
                                 "new one)";
  const auto process = detail::this_process();
  const auto r = std::to_string(rank);
  if (holder.starts_with(process + ","))
    throw store_error("rendezvous at " + url + ": rank " + r + " joined this rendezvous before, from this process (" +
                      holder + "), and the store that rendezvous gave has been released since; a job's rendezvous "
                      "is joined once: keep its store while the process needs it (another rendezvous of the job "
                      "then shares it) or pass it on (rpc::agent_options::store, gloo_group::create(store, ...))" +
                      (file ? "; " + fresh_file : ""));
  throw store_error("rendezvous at " + url + ": rank " + r + " is claimed twice: first by " + holder + ", now by " +
                    me + " (this process): " +
                    (file ? "the file holds an earlier job's rendezvous; " + fresh_file
                          : "two processes were started as rank " + r + ", or the store at " + where +
                                " is an earlier job's (is its rank 0 still running?)"));
}

// Claims this rank, registers its arrival and waits for all: logs each step
// at debug level and, on the warnings() schedule (after 5 s, then every 30 s),
// a warning naming the ranks still missing.
//
// `restart` (corodist-run's TORCHELASTIC_RESTART_COUNT, -1 when not launched
// so) goes into the claim: a worker that corodist-run restarted in place
// (--restart-policy worker: same generation, same rank, a higher restart
// count) takes over its predecessor's claim and finds the others arrived.
asio::awaitable<void> join(store& s, const std::string& url, const std::string& where, int rank, int world,
                           corodist::timeout limit, long restart) {
  using ms = std::chrono::milliseconds;
  limit = limit.or_else(default_timeout);
  const auto by = limit.from();
  const auto me = claimant() + (restart >= 0 ? ", restart " + std::to_string(restart) : std::string());
  const auto key = std::string(rdzv) + "rank/" + std::to_string(rank);
  auto holder = co_await s.compare_set(key, "", me);
  if (holder != me) {
    const long held = restart_of(holder);
    if (restart < 0 || held < 0 || held >= restart)
      claimed_twice(url, where, rank, holder, me);
    holder = co_await s.compare_set(key, holder, me);
    if (holder != me)
      claimed_twice(url, where, rank, holder, me);
    CORODIST_LOG_DEBUG("rendezvous at {}: rank {} rejoins after restart {} (it was held by {})", url, rank, restart,
                       holder);
    std::vector<std::string> done{std::string(rdzv) + "done"};
    co_await s.wait(std::move(done), by.left());
    co_return;
  }
  auto arrived = co_await s.add(std::string(rdzv) + "arrived", 1);
  if (arrived > world) // every rank claimed once: the arrivals of an earlier rendezvous are counted here
    throw store_error("rendezvous at " + url + ": rank " + std::to_string(rank) + " is arrival " +
                      std::to_string(arrived) + " in a world of " + std::to_string(world) + ": the store at " + where +
                      " holds an earlier rendezvous" +
                      (url.starts_with("file://") ? " (a file:// rendezvous needs a fresh file for each job)" : ""));
  CORODIST_LOG_DEBUG("rendezvous at {}: rank {} arrived ({} of {})", url, rank, arrived, world);
  if (arrived == world)
    co_await s.set(std::string(rdzv) + "done", "1");
  // env:// says nothing of where: the warnings do.
  const auto at = url.starts_with("env://") ? url + " (the store at " + where + ")" : url;
  const auto schedule = detail::warnings();
  const auto start = std::chrono::steady_clock::now();
  auto next_warning = start + schedule.first;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (by.expired(now))
      break;
    // Waits in slices that end when a warning is due (and are never longer
    // than the first delay, so that the store's own log of long waits stays quiet).
    auto slice = std::max(ms(1), std::min(schedule.first, std::chrono::ceil<ms>(next_warning - now)));
    if (!by.is_never())
      slice = std::min(slice, std::chrono::ceil<ms>(by.remaining(now)));
    try {
      std::vector<std::string> done{std::string(rdzv) + "done"};
      co_await s.wait(std::move(done), slice);
      CORODIST_LOG_DEBUG("rendezvous at {}: all {} ranks arrived", url, world);
      co_return;
    } catch (const timeout_error&) {
    }
    const auto after = std::chrono::steady_clock::now();
    const auto waited = std::chrono::duration_cast<ms>(after - start);
    if (by.expired(after))
      break;
    if (after < next_warning)
      continue;
    next_warning += schedule.every;
    const auto gives_up = limit.is_never() ? std::string("never") : detail::duration_text(limit.length());
    if (world <= name_missing_up_to || rank == 0) {
      auto a = co_await look_up_arrivals(s, world);
      CORODIST_LOG_WARN("rendezvous at {}: {} of {} ranks arrived after {}; waiting for ranks {} (gives up after {})",
                        at, a.count, world, detail::duration_text(waited), a.missing, gives_up);
    } else {
      auto count = co_await s.add(std::string(rdzv) + "arrived", 0);
      CORODIST_LOG_WARN("rendezvous at {}: {} of {} ranks arrived after {} (gives up after {})", at, count, world,
                        detail::duration_text(waited), gives_up);
    }
  }
  // Say who never came.
  auto a = co_await look_up_arrivals(s, world);
  throw timeout_error("rendezvous at " + url + ": only " + std::to_string(a.count) + " of " + std::to_string(world) +
                      " ranks arrived within " + std::to_string(limit.length().count()) + " ms; missing ranks: " + a.missing);
}

// Rank 0's store_server, held by its tcp_store. When that store goes, the
// server stays up until the other ranks have disconnected, at most `limit`,
// so that their last requests still find it; an owned event_loop waits for
// this before it stops.
class host_linger {
public:
  host_linger(asio::any_io_executor ex, std::shared_ptr<store_server> server, std::chrono::milliseconds limit)
      : ex_(std::move(ex)), server_(std::move(server)), limit_(limit) {}
  ~host_linger() {
    if (limit_.count() <= 0)
      return;
    try {
      auto& lingering = corodist::detail::linger_of(ex_);
      lingering.begin(corodist::detail::linger_service::clock::now() + limit_);
      // Ends the linger when the coroutine's frame goes, run or not.
      auto done = std::shared_ptr<void>(nullptr, [l = &lingering](void*) { l->end(); });
      CORODIST_LOG_DEBUG("rendezvous: rank 0's store goes: its server waits up to {} ms for the other ranks to "
                         "disconnect",
                         limit_.count());
      asio::co_spawn(
          ex_,
          [server = server_, limit = limit_, done]() -> asio::awaitable<void> {
            if (!co_await server->clients_left(0, limit))
              CORODIST_LOG_DEBUG("rendezvous: rank 0's store closes with {} client(s) still connected",
                                 server->connection_count());
          },
          asio::detached);
    } catch (...) { // nothing to linger on
    }
  }
  host_linger(const host_linger&) = delete;
  host_linger& operator=(const host_linger&) = delete;

private:
  asio::any_io_executor ex_;
  std::shared_ptr<store_server> server_;
  std::chrono::milliseconds limit_;
};


} // namespace

namespace {

/// CORODIST_RESPONDER=0 keeps a rank's debug responder off.
bool responder_wanted() {
  const char* v = std::getenv("CORODIST_RESPONDER");
  return v == nullptr || std::string_view(v) != "0";
}

/// The store a prefix_store wraps (the store itself otherwise).
std::shared_ptr<store> underlying_of(const std::shared_ptr<store>& s) {
  if (auto p = std::dynamic_pointer_cast<prefix_store>(s))
    return p->underlying();
  return s;
}

} // namespace

asio::awaitable<rendezvous_result> async_rendezvous(asio::any_io_executor ex, std::string url,
                                                    rendezvous_options opts) {
  auto u = parse(url);
  if (u.scheme != "env" && u.scheme != "tcp" && u.scheme != "file")
    bad_url(url, "unknown scheme '" + u.scheme + "' (env://, tcp://, file://)");
  const detail::launch_env env = u.scheme == "env" ? detail::read_launch_env() : detail::launch_env{};
  const int rank = static_cast<int>(to_int(url, "rank", setting(u, url, "rank", env.rank, "RANK", "SLURM_PROCID")));
  const int world = static_cast<int>(
      to_int(url, "world_size", setting(u, url, "world_size", env.world_size, "WORLD_SIZE", "SLURM_NTASKS")));
  if (world <= 0 || rank < 0 || rank >= world)
    bad_url(url, "need 0 <= rank < world_size (rank " + std::to_string(rank) + ", world_size " + std::to_string(world) +
                     ")");
  if (auto it = u.query.find("timeout"); it != u.query.end())
    opts.timeout = timeout_seconds(url, it->second);

  std::string host, port_text;
  detail::job_id job{"", rank, world};
  if (u.scheme == "file") {
    if (u.path.empty())
      bad_url(url, "no path");
    job.target = "file://" + u.path;
  } else {
    host = u.scheme == "env" ? setting(u, url, "master_addr", env.master_addr, "MASTER_ADDR", "SLURM_JOB_NODELIST")
                             : u.host;
    port_text = u.scheme == "env" ? setting(u, url, "master_port", env.master_port, "MASTER_PORT", nullptr) : u.port;
    if (host.empty() || port_text.empty())
      bad_url(url, "need host:port");
    job.target = "tcp://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + port_text;
  }

  // A job this process has joined already (an RPC agent's, say, and now a
  // process group's): its store, without joining again.
  auto found = co_await detail::find_or_claim(job);
  if (found.shared) {
    CORODIST_LOG_DEBUG("rendezvous at {}: rank {} of {} shares this process's earlier rendezvous of the job", url,
                       rank, world);
    co_return rendezvous_result{std::move(found.shared), rank, world};
  }

  rendezvous_result result{nullptr, rank, world};
  std::string where = u.path;
  if (u.scheme == "file") {
    result.store = std::make_shared<file_store>(ex, u.path);
    result.store->set_timeout(opts.timeout);
  } else {
    auto port = static_cast<std::uint16_t>(to_int(url, "port", port_text));
    std::shared_ptr<store_server> server;
    // Under corodist-run (and torchrun) the launcher of node 0 hosts the store:
    // rank 0 is a client like the others.
    if (rank == 0 && !env.use_agent_store) {
      // Bind the address we were given (resolved), not every interface.
      asio::ip::tcp::resolver resolver(ex);
      auto [ec, results] = co_await resolver.async_resolve(host, port_text,
                                                           asio::experimental::as_tuple(asio::use_awaitable));
      if (ec || results.empty())
        throw connection_error("rendezvous: cannot resolve '" + host + "': " + ec.message());
      server_options so;
      so.host = results.begin()->endpoint().address().to_string();
      so.port = port;
      so.auth_token = opts.auth_token;
      so.tls = opts.tls;
      try {
        server = store_server::start(ex, so);
      } catch (const connection_error& e) {
        const auto others = detail::other_jobs_at(job);
        throw connection_error("rendezvous at " + url + ": rank 0 cannot host the store: " + e.what() +
                               (others.empty()
                                    ? " (another program listens there, or an earlier job's rank 0 still runs: "
                                      "stop it or pick another port)"
                                    : " (this process hosts the rendezvous of another job there, as " + others +
                                          ": each job needs a port of its own)"));
      }
      CORODIST_LOG_INFO("rendezvous: rank 0 hosts the store on {}:{}", so.host, port);
    }
    tcp_store_options to;
    to.host = host;
    to.port = port;
    to.timeout = opts.timeout;
    to.auth_token = opts.auth_token;
    to.tls = opts.tls;
    where = detail::where(to);
    auto client = co_await tcp_store::connect(ex, to);
    if (server) // rank 0's server lives as long as its store, and lingers for the others
      client->keep_until_destroyed(std::make_shared<host_linger>(ex, server, opts.host_linger));
    result.store = client;
    if (env.use_agent_store && env.generation) {
      // corodist-run's generation: the keys of this generation's workers live
      // under a prefix of their own; a worker left from an earlier one is refused.
      const auto mine = to_int(url, "generation ($CORODIST_GENERATION)", *env.generation);
      std::vector<std::string> gen_key{detail::generation_key};
      if (co_await client->check(gen_key)) {
        const auto current_text = co_await client->get(detail::generation_key);
        const auto current = to_int(url, "the job's generation", current_text);
        if (current != mine)
          throw store_error("rendezvous at " + url + ": this worker (rank " + std::to_string(rank) +
                            ") was started for generation " + std::to_string(mine) +
                            " of the job, which is at generation " + current_text +
                            " now (corodist-run restarted its workers since): a worker of an earlier generation "
                            "cannot join a later one");
      }
      result.store = std::make_shared<prefix_store>(detail::generation_prefix(mine), client);
    }
  }
  const long restart = env.use_agent_store && env.restart_count
                           ? to_int(url, "restart count ($TORCHELASTIC_RESTART_COUNT)", *env.restart_count)
                           : -1;
  co_await join(*result.store, url, where, rank, world, opts.timeout, restart);
  found.claim->joined(result.store);
  // Under a launcher that hosts the store, the rank answers its hang watch.
  if (env.use_agent_store && responder_wanted()) {
    std::shared_ptr<debug_responder> responder;
    try {
      responder = co_await debug_responder::async_start(result.store, rank, world);
    } catch (const store_error& e) {
      CORODIST_LOG_WARN("rendezvous at {}: rank {} runs without a debug responder: {}", url, rank, e.what());
    }
    auto client = std::dynamic_pointer_cast<tcp_store>(underlying_of(result.store));
    if (client && responder)
      client->keep_until_destroyed(std::move(responder));
  }
  co_return result;
}

std::optional<int> local_rank_from_env() {
  auto e = detail::read_launch_env();
  if (!e.local_rank)
    return std::nullopt;
  int v = 0;
  auto [p, ec] = std::from_chars(e.local_rank->data(), e.local_rank->data() + e.local_rank->size(), v);
  if (ec != std::errc{} || p != e.local_rank->data() + e.local_rank->size() || v < 0)
    throw store_error("local rank '" + *e.local_rank + "' (LOCAL_RANK or SLURM_LOCALID) is not a non-negative integer");
  return v;
}

rendezvous_result rendezvous(event_loop& loop, std::string_view url, rendezvous_options opts) {
  if ((!loop.embedded() && !loop.running()) || loop.context().stopped())
    throw usage_error("rendezvous(): the event loop is not running (call loop.start() first)");
  return run_blocking(loop.get_executor(), async_rendezvous(loop.get_executor(), std::string(url), opts),
                      "rendezvous() (co_await async_rendezvous() on the loop)");
}

} // namespace corodist::store
