#include "store/rendezvous/launch_env.hpp"

#include <corodist/core/error.hpp>
#include <corodist/store/errors.hpp>

#include <cstdlib>

namespace corodist::store::detail {

namespace {

std::optional<std::string> env(const char* name) {
  if (const char* v = std::getenv(name); v && *v)
    return std::string(v);
  return std::nullopt;
}

[[noreturn]] void bad_list(std::string_view list, const std::string& why) {
  throw store_error("bad Slurm node list '" + std::string(list) + "': " + why);
}

bool all_digits(std::string_view s) {
  if (s.empty())
    return false;
  for (char c : s)
    if (c < '0' || c > '9')
      return false;
  return true;
}

// Checks one bracket item ("7", "01-04") and returns its first value as written.
std::string_view first_of_item(std::string_view list, std::string_view item) {
  auto quoted = [&](std::string_view before, std::string_view after) {
    std::string why(before);
    why.append(item).append(after);
    return why;
  };
  auto dash = item.find('-');
  auto lo = item.substr(0, dash);
  if (!all_digits(lo))
    bad_list(list, quoted("'", "' in brackets is not N or LO-HI"));
  if (dash != std::string_view::npos) {
    auto hi = item.substr(dash + 1);
    if (!all_digits(hi))
      bad_list(list, quoted("'", "' in brackets is not N or LO-HI"));
    if (std::strtoull(std::string(lo).c_str(), nullptr, 10) > std::strtoull(std::string(hi).c_str(), nullptr, 10))
      bad_list(list, quoted("range '", "' runs backwards"));
  }
  return lo;
}

} // namespace

std::string slurm_first_host(std::string_view list) {
  if (list.empty())
    bad_list(list, "empty");
  std::string first;
  bool in_first = true;    // still in the list's first entry
  std::size_t entry_chars = 0;
  for (std::size_t i = 0; i < list.size();) {
    const char c = list[i];
    if (c == '[') {
      auto close = list.find(']', i);
      if (close == std::string_view::npos)
        bad_list(list, "'[' without ']'");
      auto group = list.substr(i + 1, close - i - 1);
      if (group.find('[') != std::string_view::npos)
        bad_list(list, "nested '['");
      if (group.empty())
        bad_list(list, "empty brackets");
      std::size_t start = 0;
      std::string_view first_item;
      for (;;) {
        auto comma = group.find(',', start);
        auto item = group.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
        auto lo = first_of_item(list, item);
        if (first_item.empty())
          first_item = lo;
        if (comma == std::string_view::npos)
          break;
        start = comma + 1;
      }
      if (in_first)
        first.append(first_item);
      ++entry_chars;
      i = close + 1;
    } else if (c == ']') {
      bad_list(list, "']' without '['");
    } else if (c == ',') {
      if (entry_chars == 0)
        bad_list(list, "empty host name");
      in_first = false;
      entry_chars = 0;
      ++i;
    } else {
      if (in_first)
        first.push_back(c);
      ++entry_chars;
      ++i;
    }
  }
  if (entry_chars == 0)
    bad_list(list, "empty host name");
  return first;
}

launch_env read_launch_env() {
  launch_env e;
  e.rank = env("RANK");
  e.world_size = env("WORLD_SIZE");
  e.local_rank = env("LOCAL_RANK");
  e.master_addr = env("MASTER_ADDR");
  e.master_port = env("MASTER_PORT");
  e.use_agent_store = env("TORCHELASTIC_USE_AGENT_STORE") == std::optional<std::string>("True");
  e.generation = env(generation_variable);
  e.restart_count = env("TORCHELASTIC_RESTART_COUNT");
  if (!e.rank && !e.world_size) {
    auto procid = env("SLURM_PROCID");
    auto ntasks = env("SLURM_NTASKS");
    if (procid && ntasks) {
      e.rank = procid;
      e.world_size = ntasks;
      e.slurm = true;
      if (!e.local_rank)
        e.local_rank = env("SLURM_LOCALID");
    }
  }
  if (!e.master_addr) {
    // The step's nodes (where this srun's tasks run, task 0 on the first), else the job's.
    auto list = env("SLURM_STEP_NODELIST");
    if (!list)
      list = env("SLURM_JOB_NODELIST");
    if (list)
      e.master_addr = slurm_first_host(*list);
  }
  return e;
}

} // namespace corodist::store::detail
