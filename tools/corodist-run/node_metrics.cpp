#include "node_metrics.hpp"

#include <corodist/metrics/metrics_server.hpp>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <unistd.h>

namespace corodist::tools::launch {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view file_prefix = "rank-";

} // namespace

node_metrics::node_metrics(std::uint16_t port, const std::string& bind) {
  std::string tmpl = (fs::temp_directory_path() / "corodist-metrics-XXXXXX").string();
  if (!::mkdtemp(tmpl.data()))
    throw fs::filesystem_error("cannot make a folder for the ranks' metrics ports", tmpl,
                               std::error_code(errno, std::generic_category()));
  dir_ = tmpl;
  try {
    server_ = std::make_unique<corodist::metrics::node_metrics_server>(port, bind, [this] { return endpoints(); });
  } catch (...) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    throw;
  }
}

node_metrics::~node_metrics() {
  server_.reset(); // no scrape reads the folder after this
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::vector<std::pair<std::string, std::string>> node_metrics::rank_env(int rank) const {
  const std::string file = (fs::path(dir_) / (std::string(file_prefix) + std::to_string(rank))).string();
  std::error_code ec;
  fs::remove(file, ec);
  return {{corodist::metrics::port_variable, "0"}, {corodist::metrics::port_file_variable, file}};
}

// The ranks that have written their port, from the folder (read on civetweb's
// thread: nothing shared with the launcher's own).
std::vector<corodist::metrics::rank_endpoint> node_metrics::endpoints() const {
  std::vector<corodist::metrics::rank_endpoint> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(file_prefix))
      continue;
    int rank = -1;
    const char* first = name.data() + file_prefix.size();
    const char* last = name.data() + name.size();
    if (auto [p, err] = std::from_chars(first, last, rank); err != std::errc{} || p != last)
      continue; // a temporary file being written
    unsigned port = 0;
    std::ifstream in(e.path());
    if (!(in >> port) || port == 0 || port > 65535)
      continue;
    out.push_back({rank, static_cast<std::uint16_t>(port)});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return out;
}

} // namespace corodist::tools::launch
