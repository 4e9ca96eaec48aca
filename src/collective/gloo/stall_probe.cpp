// The stall probe: which stalled collectives a gloo_group compares with the
// other ranks' through the store, the comparison, and what a difference does.
#include "collective/gloo/stall_probe.hpp"

#include "collective/gloo/gloo_group_impl.hpp"
#include "core/deadline.hpp"
#include "core/log.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/use_future.hpp>

#include <fmt/format.h>

#include <charconv>
#include <cstring>
#include <string_view>
#include <future>

namespace corodist::collective {

namespace detail {

namespace {

// Keys "stalled/0" .. "stalled/255": a collective's slot is reused 256
// collectives later (a record of an older collective found there is replaced).
constexpr std::uint64_t stalled_keys = 256;
constexpr const char* mismatch_key = "mismatch";
constexpr const char* waiting_key = "waiting/"; // + rank

// "<seq>\n<text>", the value of mismatch_key.
std::optional<std::string> text_for(std::uint64_t seq, const std::string& value) {
  const auto nl = value.find('\n');
  std::uint64_t found = 0;
  if (nl == std::string::npos || std::from_chars(value.data(), value.data() + nl, found).ptr != value.data() + nl ||
      found != seq)
    return std::nullopt;
  return value.substr(nl + 1);
}

} // namespace

stall_probe::stall_probe(std::shared_ptr<store::store> group_keys, std::string label, bool options_only,
                         report_fn report)
    : keys_(std::move(group_keys)), label_(std::move(label)), options_only_(options_only), report_(std::move(report)) {}

void stall_probe::start(const call_record& mine) {
  busy_.store(true, std::memory_order_release);
  try {
    asio::co_spawn(keys_->get_executor(), probe(mine), asio::detached);
  } catch (...) {
    busy_.store(false, std::memory_order_release);
    throw;
  }
}

// The record of the first stalled rank of the same collective, when it made
// another call; nullopt when the calls are the same, or when this rank's
// record is the first (the later ones compare with it).
asio::awaitable<std::optional<call_record>> stall_probe::compare(call_record mine) {
  const auto key = fmt::format("stalled/{}", mine.header.seq % stalled_keys);
  const auto bytes = encode(mine);
  std::string expected; // "": create the key if it is missing
  for (int attempt = 0; attempt < 4; ++attempt) {
    auto now = co_await keys_->compare_set(key, expected, bytes);
    if (now == bytes)
      co_return std::nullopt;
    auto other = decode(now);
    if (!other || other->header.seq < mine.header.seq) { // an older collective's: replace it
      expected = std::move(now);
      continue;
    }
    if (other->header.seq > mine.header.seq) // a later one's: the ranks moved on
      co_return std::nullopt;
    if (other->same_call(mine) || (options_only_ && !(other->header == mine.header)))
      co_return std::nullopt;
    co_return *other;
  }
  co_return std::nullopt;
}

asio::awaitable<void> stall_probe::set_or_log(std::string key, std::string value, int rank) {
  auto set = [](std::shared_ptr<store::store> keys, std::string k, std::string v) -> asio::awaitable<bool> {
    co_await keys->set(std::move(k), std::move(v));
    co_return true;
  };
  try {
    if (!co_await corodist::detail::within(set(keys_, key, std::move(value)), probe_limit))
      CORODIST_LOG_WARN("{} (rank {}): setting '{}' in the store timed out (ignored)", label_, rank, key);
  } catch (const std::exception& e) {
    CORODIST_LOG_WARN("{} (rank {}): setting '{}' in the store failed (ignored): {}", label_, rank, key, e.what());
  }
}

asio::awaitable<void> stall_probe::probe(call_record mine) {
  const auto self = shared_from_this(); // the store and the report outlive the probe
  const auto seq = mine.header.seq;
  std::optional<std::optional<call_record>> other;
  try {
    other = co_await corodist::detail::within(compare(mine), probe_limit);
    if (!other)
      CORODIST_LOG_WARN("{} (rank {}): the stall probe of collective #{} gave up after {} ms (ignored)", label_,
                        mine.rank, seq, probe_limit.count());
  } catch (const std::exception& e) {
    CORODIST_LOG_WARN("{} (rank {}): the stall probe of collective #{} failed (ignored): {}", label_, mine.rank, seq,
                      e.what());
  }
  // Which collective this rank waits in, for people looking at a hung job.
  co_await set_or_log(fmt::format("{}{}", waiting_key, mine.rank),
                      fmt::format("collective #{}: {}", seq, header_text(mine.header)), mine.rank);
  if (other && *other) {
    const auto text = difference_text(mine, **other);
    // For the ranks whose collective fails without their finding it.
    co_await set_or_log(mismatch_key, fmt::format("{}\n{}", seq, text), mine.rank);
    try {
      std::lock_guard lk(report_mutex_);
      if (report_)
        report_(seq, text);
    } catch (const std::exception& e) {
      CORODIST_LOG_ERROR("{} (rank {}): reporting the mismatch failed: {}", label_, mine.rank, e.what());
    }
  }
  busy_.store(false, std::memory_order_release);
}

std::optional<std::string> stall_probe::found_by_peer(std::uint64_t seq, std::chrono::milliseconds limit) {
  auto read = [](std::shared_ptr<store::store> keys,
                 std::chrono::milliseconds limit) -> asio::awaitable<std::optional<std::string>> {
    std::vector<std::string> key{mismatch_key}; // named: GCC 12 destroys a braced temporary in co_await twice
    if (!co_await keys->check(std::move(key)))
      co_return std::nullopt;
    co_return co_await keys->get(mismatch_key, limit);
  };
  try {
    auto f = asio::co_spawn(keys_->get_executor(), corodist::detail::within(read(keys_, limit), limit),
                            asio::use_future);
    if (f.wait_for(limit + std::chrono::milliseconds(100)) != std::future_status::ready)
      return std::nullopt;
    auto value = f.get();
    if (value && *value)
      return text_for(seq, **value);
  } catch (const std::exception& e) {
    CORODIST_LOG_DEBUG("{}: reading the mismatch key failed: {}", label_, e.what());
  }
  return std::nullopt;
}

std::optional<std::vector<std::optional<std::uint64_t>>> stall_probe::waiting_in(int size,
                                                                                std::chrono::milliseconds limit) {
  using result = std::vector<std::optional<std::uint64_t>>;
  auto read = [](std::shared_ptr<store::store> keys, int size, std::chrono::milliseconds limit) -> asio::awaitable<result> {
    result seen(static_cast<std::size_t>(size));
    auto names = co_await keys->list_keys(waiting_key); // the ranks that ever waited
    if (names.empty())
      co_return seen;
    auto values = co_await keys->multi_get(names, limit);
    for (std::size_t i = 0; i < names.size() && i < values.size(); ++i) {
      // "waiting/<rank>" = "collective #<seq>: <call>"
      const std::string_view name = std::string_view(names[i]).substr(std::strlen(waiting_key));
      const std::string_view value = values[i];
      int r = -1;
      std::uint64_t seq = 0;
      const auto hash = value.find('#');
      if (std::from_chars(name.data(), name.data() + name.size(), r).ec != std::errc{} || r < 0 || r >= size ||
          hash == std::string_view::npos ||
          std::from_chars(value.data() + hash + 1, value.data() + value.size(), seq).ec != std::errc{})
        continue;
      seen[static_cast<std::size_t>(r)] = seq;
    }
    co_return seen;
  };
  try {
    auto f = asio::co_spawn(keys_->get_executor(), corodist::detail::within(read(keys_, size, limit), limit),
                            asio::use_future);
    if (f.wait_for(limit + std::chrono::milliseconds(100)) != std::future_status::ready)
      return std::nullopt;
    if (auto seen = f.get())
      return std::move(*seen);
  } catch (const std::exception& e) {
    CORODIST_LOG_DEBUG("{}: reading the waiting keys failed: {}", label_, e.what());
  }
  return std::nullopt;
}

void stall_probe::detach() {
  std::lock_guard lk(report_mutex_);
  report_ = nullptr;
}

} // namespace detail

// ---- the group's side -------------------------------------------------------------

void gloo_group::impl::probe_stalled(clock::time_point now) {
  if (probe->busy())
    return;
  for (auto& [seq, op] : inflight) {
    const auto started = op->started.load(std::memory_order_acquire);
    if (started == 0 || op->state->completed())
      continue;
    const auto ran = now - clock::time_point(clock::duration(started));
    if (ran < op->probe_after)
      continue;
    op->probe_after = 2 * ran; // the next probe of this collective after twice as long
    try {
      probe->start(detail::record_of(op->call, seq, rank, opts.bcube_max_bytes, opts.bucket_bytes));
    } catch (const std::exception& e) { // the watchdog goes on with its deadlines
      CORODIST_LOG_WARN("{} (rank {}): could not start the stall probe of collective #{} (ignored): {}", label, rank,
                        seq, e.what());
    }
    return; // one probe at a time, the oldest stalled collective first
  }
}

void gloo_group::impl::mismatch_found(std::uint64_t seq, const std::string& text) {
  std::string site = fmt::format("collective #{} on rank {} of {} ({})", seq, rank, size, label);
  {
    std::lock_guard lk(mutex);
    if (auto it = inflight.find(seq); it != inflight.end()) {
      it->second->mismatch = text;
      site = where(*it->second);
    }
  }
  abort(site + ": " + text + "; the group is aborted");
}

} // namespace corodist::collective
