#include <corodist/core/error.hpp>
#include <corodist/store/debug_responder.hpp>
#include <corodist/store/errors.hpp>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <set>

namespace corodist::store {

namespace {

std::int64_t unix_ns_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// The number at the end of `key` after `prefix` ("debug/rank/3" -> 3); -1 if none.
int rank_in(const std::string& key, const std::string& prefix) {
  if (!key.starts_with(prefix))
    return -1;
  int r = -1;
  const char* b = key.data() + prefix.size();
  const char* e = key.data() + key.size();
  auto [p, ec] = std::from_chars(b, e, r);
  return ec == std::errc() ? r : -1;
}

} // namespace

asio::awaitable<std::vector<rank_dump>> gather_dumps(std::shared_ptr<store> job_store, int world_size,
                                                     corodist::timeout limit) {
  co_return co_await gather_dumps(std::move(job_store), world_size, limit, std::vector<int>{});
}

asio::awaitable<std::vector<rank_dump>> gather_dumps(std::shared_ptr<store> job_store, int world_size,
                                                     corodist::timeout limit, std::vector<int> only) {
  if (!job_store)
    throw usage_error("gather_dumps: no store");
  const auto by = limit.or_else(std::chrono::seconds(5)).from();
  auto left = [&] { return by.left(); };
  if (world_size <= 0) {
    const auto text = co_await job_store->get(debug_key("world_size"), left());
    world_size = 0;
    std::from_chars(text.data(), text.data() + text.size(), world_size);
    if (world_size <= 0)
      throw store_error("gather_dumps: the job's debug/world_size is '" + text + "'");
  }
  const auto t0 = unix_ns_now();
  const auto n = co_await job_store->add(debug_key("request"), 1);
  const auto suffix = "/" + std::to_string(n);
  std::vector<std::string> keys;
  keys.reserve(world_size);
  for (int r = 0; r < world_size; ++r)
    keys.push_back(debug_key("dump/" + std::to_string(r)) + suffix);
  std::vector<bool> awaited(world_size, only.empty());
  for (int r : only)
    if (r >= 0 && r < world_size)
      awaited[r] = true;
  std::vector<std::string> wait_for;
  for (int r = 0; r < world_size; ++r)
    if (awaited[r])
      wait_for.push_back(keys[r]);
  bool all = only.empty();
  try {
    if (!wait_for.empty())
      co_await job_store->wait(wait_for, left());
  } catch (const corodist::timeout_error&) {
    all = false;
  }
  const auto t1 = unix_ns_now();
  std::vector<bool> answered(world_size, all);
  if (!all) {
    const std::string prefix = debug_key("dump/");
    for (const auto& k : co_await job_store->list_keys(prefix))
      if (k.ends_with(suffix))
        if (int r = rank_in(k, prefix); r >= 0 && r < world_size)
          answered[r] = true;
  }
  std::vector<std::string> present;
  for (int r = 0; r < world_size; ++r)
    if (answered[r])
      present.push_back(keys[r]);
  std::vector<std::string> texts;
  if (!present.empty())
    texts = co_await job_store->multi_get(present, corodist::timeout(std::chrono::seconds(5)));
  std::set<int> registered;
  if (!all) {
    const std::string prefix = debug_key("rank/");
    for (const auto& k : co_await job_store->list_keys(prefix))
      registered.insert(rank_in(k, prefix));
  }
  std::vector<rank_dump> out(world_size);
  const auto waited_ms = (t1 - t0) / 1'000'000;
  std::size_t next = 0;
  for (int r = 0; r < world_size; ++r) {
    auto& d = out[r];
    d.rank = r;
    d.offset_error = std::chrono::nanoseconds((t1 - t0) / 2);
    if (!answered[r]) {
      d.problem = !awaited[r]           ? std::string("not waited for")
                  : registered.contains(r) 
                      ? fmt::format("did not answer within {} ms (its event loop is busy or stopped)", waited_ms)
                      : fmt::format("did not answer within {} ms (no debug responder registered: the process has "
                                    "ended, or never started one)",
                                    waited_ms);
      continue;
    }
    d.json = std::move(texts[next++]);
    try {
      const auto doc = nlohmann::json::parse(d.json);
      d.clock_offset = std::chrono::nanoseconds(doc.at("unix_ns").get<std::int64_t>() - (t0 + t1) / 2);
    } catch (const std::exception& e) {
      d.problem = std::string("answered with a document that does not parse: ") + e.what();
      d.json.clear();
    }
  }
  for (const auto& k : present)
    (void)co_await job_store->delete_key(k);
  co_return out;
}

} // namespace corodist::store
