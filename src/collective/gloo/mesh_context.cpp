// Connecting a gloo_group's full mesh: Gloo's keys, few store round trips,
// every pair at once.
#include "collective/gloo/mesh_context.hpp"

#include <gloo/common/error.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>

#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <unistd.h>

namespace corodist::collective::detail {

void mesh_context::connect_mesh(gloo_store& store, const std::shared_ptr<gloo::transport::Device>& dev) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0)
    throw std::system_error(errno, std::system_category(), "gethostname");
  const std::string local_host(host);
  store.set("rank_" + std::to_string(rank), std::vector<char>(local_host.begin(), local_host.end()));

  auto transport = dev->createContext(rank, size);
  transport->setTimeout(getTimeout());
  std::vector<char> mine;
  for (int i = 0; i < size; ++i) {
    if (i == rank)
      continue;
    auto& pair = transport->createPair(i);
    const auto bytes = pair->address().bytes();
    mine.insert(mine.end(), bytes.begin(), bytes.end());
  }
  store.set(std::to_string(rank), mine);

  // Every peer's addresses, and the host names of the ranks below this one
  // (Gloo counts those on this host as its local rank), in one wait and one read.
  std::vector<std::string> keys;
  for (int i = 0; i < size; ++i)
    if (i != rank)
      keys.push_back(std::to_string(i));
  for (int i = 0; i < rank; ++i)
    keys.push_back("rank_" + std::to_string(i));
  store.wait(keys, getTimeout());
  auto values = store.multi_get(keys);
  int local_rank = 0;
  for (int i = 0; i < rank; ++i)
    if (values[static_cast<std::size_t>(size - 1 + i)] == local_host)
      ++local_rank;
  addresses_.assign(static_cast<std::size_t>(size), std::string());
  for (int i = 0, k = 0; i < size; ++i)
    if (i != rank)
      addresses_[static_cast<std::size_t>(i)] = std::move(values[static_cast<std::size_t>(k++)]);

  // Each pair's connect blocks until its peer's side is there: all at once.
  std::mutex m;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(size));
  for (int i = 0; i < size; ++i) {
    if (i == rank)
      continue;
    auto& pair = transport->getPair(i);
    pair->setLocalRank(local_rank);
    threads.emplace_back([&, i, p = pair.get()] {
      try {
        p->connect(peer_address(i));
      } catch (...) {
        std::lock_guard lk(m);
        if (!first)
          first = std::current_exception();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  if (first)
    std::rethrow_exception(first);
  device_ = dev;
  transportContext_ = std::move(transport);
}

std::vector<char> mesh_context::peer_address(int i) const {
  const auto& all = addresses_.at(static_cast<std::size_t>(i));
  const auto one = all.size() / static_cast<std::size_t>(size - 1);
  const auto slot = static_cast<std::size_t>(rank > i ? rank - 1 : rank);
  return std::vector<char>(all.begin() + static_cast<std::ptrdiff_t>(slot * one),
                           all.begin() + static_cast<std::ptrdiff_t>((slot + 1) * one));
}

} // namespace corodist::collective::detail
