#include "rpc/worker_registry.hpp"

#include <corodist/core/error.hpp>

#include "core/log.hpp"

#include <msgpack.hpp>

#include <tuple>

namespace corodist::rpc::detail {

std::string encode_worker_record(const worker_info& w) {
  msgpack::sbuffer b;
  msgpack::pack(b, std::make_tuple(w.name, w.host, w.port));
  return std::string(b.data(), b.size());
}

worker_info decode_worker_record(int rank, const std::string& record) {
  try {
    auto h = msgpack::unpack(record.data(), record.size());
    auto [name, host, port] = h.get().as<std::tuple<std::string, std::string, std::uint16_t>>();
    return worker_info{std::move(name), rank, std::move(host), port};
  } catch (const std::exception& e) {
    throw protocol_error("rpc: malformed worker record for rank " + std::to_string(rank) + " (" + e.what() +
                         "): was the store used by another kind of job under the same key prefix?");
  }
}

worker_registry::worker_registry(std::string prefix, std::string agent_name)
    : prefix_(std::move(prefix)), agent_name_(std::move(agent_name)) {}

asio::awaitable<void> worker_registry::join(store::store& s, worker_info self, int world_size,
                                            corodist::timeout timeout) {
  const auto my_rank = std::to_string(self.rank);
  auto owner = co_await s.compare_set(prefix_ + "names/" + self.name, "", my_rank);
  if (owner != my_rank)
    throw usage_error("rpc: worker name '" + self.name + "' is already taken by rank " + owner + " (this is rank " +
                      my_rank + ")");
  auto holder = co_await s.compare_set(prefix_ + "ranks/" + my_rank, "", self.name);
  if (holder != self.name)
    throw usage_error("rpc: rank " + my_rank + " is already taken by worker '" + holder + "' (this is worker '" +
                      self.name + "')");
  co_await s.set(prefix_ + "workers/" + my_rank, encode_worker_record(self));
  CORODIST_LOG_DEBUG("rpc: agent '{}' published itself (rank {}); waiting for {} workers", self.name, my_rank,
                     world_size);
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r)
    keys.push_back(prefix_ + "workers/" + std::to_string(r));
  std::vector<std::string> records;
  try {
    records = co_await s.multi_get(std::move(keys), timeout);
  } catch (const timeout_error& e) {
    throw timeout_error("rpc: agent '" + self.name + "': not all " + std::to_string(world_size) +
                        " workers joined within " + timeout.str() + " (" + e.what() + ")");
  }
  auto t = std::make_unique<worker_table>();
  for (int r = 0; r < world_size; ++r) {
    t->by_rank.push_back(decode_worker_record(r, records[static_cast<std::size_t>(r)]));
    if (auto [it, fresh] = t->rank_of.emplace(t->by_rank.back().name, r); !fresh)
      throw usage_error("rpc: worker name '" + it->first + "' is used by ranks " + std::to_string(it->second) +
                        " and " + std::to_string(r));
  }
  self_rank_ = self.rank;
  owned_ = std::move(t);
  table_.store(owned_.get(), std::memory_order_release);
}

const worker_table& worker_registry::require() const {
  const auto* t = table();
  if (!t)
    throw usage_error("rpc: agent '" + agent_name_ + "' is not started");
  return *t;
}

const worker_info& worker_registry::lookup(worker_ref w) const {
  const auto& t = require();
  if (w.by_rank()) {
    if (static_cast<std::size_t>(w.rank()) >= t.by_rank.size())
      throw usage_error("rpc: no worker of rank " + std::to_string(w.rank()) + " (world size " +
                        std::to_string(t.by_rank.size()) + ")");
    return t.by_rank[static_cast<std::size_t>(w.rank())];
  }
  auto it = t.rank_of.find(std::string(w.name()));
  if (it == t.rank_of.end())
    throw usage_error("rpc: no worker named '" + std::string(w.name()) + "'");
  return t.by_rank[static_cast<std::size_t>(it->second)];
}

const worker_info& worker_registry::self() const { return require().by_rank[static_cast<std::size_t>(self_rank_)]; }

} // namespace corodist::rpc::detail
