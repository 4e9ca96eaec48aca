#include "store/rendezvous/joined_jobs.hpp"

#include <corodist/core/shared_future.hpp>

#include <asio/use_awaitable.hpp>

#include <unistd.h>

#include <map>
#include <mutex>

namespace corodist::store::detail {

namespace {

struct job_state {
  corodist::shared_future<void> settled;        ///< ready once the rendezvous in progress has ended
  std::weak_ptr<corodist::store::store> shared; ///< what it yielded, once it succeeded
  std::string what;                             ///< "rank R of a world of W"
  pid_t pid = ::getpid();                       ///< the process that joined (not a child forked since)
};

struct registry {
  std::mutex mutex;
  std::map<std::string, job_state> jobs; // by key_of()
};

registry& the_registry() {
  static registry r; // never destroyed before the stores that name it are
  return r;
}

std::string key_of(const job_id& j) {
  return j.target + " rank " + std::to_string(j.rank) + " world " + std::to_string(j.world_size);
}

// Forgets the jobs whose rendezvous ended and whose store is gone, and those
// of the process this one was forked from (their stores' loops are not here).
// Call with the mutex held.
void prune(registry& r) {
  const auto me = ::getpid();
  std::erase_if(r.jobs, [me](const auto& kv) {
    return kv.second.pid != me || (kv.second.settled.is_ready() && kv.second.shared.expired());
  });
}

void settle(std::optional<corodist::promise<void>>& p) {
  if (auto settle = std::exchange(p, std::nullopt))
    settle->set_value();
}

} // namespace

job_claim::~job_claim() {
  if (!settle_)
    return;
  auto& r = the_registry();
  {
    std::lock_guard lock(r.mutex);
    r.jobs.erase(key_);
  }
  settle(settle_); // those waiting look again, and one of them joins
}

void job_claim::joined(const std::shared_ptr<store>& s) {
  auto& r = the_registry();
  {
    std::lock_guard lock(r.mutex);
    if (auto it = r.jobs.find(key_); it != r.jobs.end())
      it->second.shared = s;
  }
  settle(settle_);
}

asio::awaitable<job_lookup> find_or_claim(const job_id& job) {
  auto& r = the_registry();
  const auto key = key_of(job);
  for (;;) {
    corodist::shared_future<void> in_progress;
    {
      std::lock_guard lock(r.mutex);
      prune(r);
      auto it = r.jobs.find(key);
      if (it != r.jobs.end() && it->second.settled.is_ready()) {
        if (auto s = it->second.shared.lock())
          co_return job_lookup{std::move(s), std::nullopt};
        r.jobs.erase(it); // its store went just now
        it = r.jobs.end();
      }
      if (it == r.jobs.end()) {
        corodist::promise<void> p;
        r.jobs.emplace(key, job_state{p.get_future().share(), {},
                                      "rank " + std::to_string(job.rank) + " of a world of " +
                                          std::to_string(job.world_size)});
        co_return job_lookup{nullptr, job_claim(key, std::move(p))};
      }
      in_progress = it->second.settled;
    }
    co_await in_progress.async_wait(asio::use_awaitable); // then look again
  }
}

std::string other_jobs_at(const job_id& job) {
  auto& r = the_registry();
  const auto mine = key_of(job);
  const auto at = job.target + " ";
  std::lock_guard lock(r.mutex);
  std::string out;
  for (auto& [key, state] : r.jobs)
    if (key != mine && key.compare(0, at.size(), at) == 0 && state.pid == ::getpid() &&
        (!state.settled.is_ready() || !state.shared.expired()))
      out += (out.empty() ? "" : ", ") + state.what;
  return out;
}

std::string this_process() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0)
    host[0] = '\0';
  return "pid " + std::to_string(::getpid()) + " on " + (host[0] ? std::string(host) : std::string("this host"));
}

} // namespace corodist::store::detail
