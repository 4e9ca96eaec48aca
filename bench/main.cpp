/// \file
/// corodist-bench [--suite a,b] [--quick] [--json FILE|-] [--pin] [--list] [--no-peers]

#include "harness.hpp"
#include "pin_cpu.hpp"

#include <corodist/metrics/metrics_server.hpp>

#include <CLI/CLI.hpp>
#include <fmt/format.h>


#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {

using corodist::bench::suite_entry;

std::string join_names(const std::vector<suite_entry>& suites) {
  std::string out;
  for (const auto& s : suites) {
    if (!out.empty()) out += ", ";
    out += s.name;
  }
  return out;
}


struct file_closer {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};

} // namespace

int main(int argc, char** argv) {
  namespace cb = corodist::bench;
  const auto all_suites = cb::registered_suites();

  CLI::App app{"corodist latency/throughput microbenchmarks. Every case is also reported as a ratio "
               "to a raw blocking-socket TCP floor measured at start.",
               "corodist-bench"};
  std::vector<std::string> requested;
  bool quick = false;
  bool pin = false;
  bool list = false;
  std::string json_path;
  app.add_option("--suite", requested, "Comma-separated suites to run (default: all): " + join_names(all_suites))
      ->delimiter(',');
  app.add_flag("--quick", quick, "Fewer samples and bytes (a smoke run, seconds instead of minutes)");
  app.add_option("--json", json_path, "Also write one JSON object per case to FILE; '-' = stdout "
                                      "(the table then goes to stderr)");
  app.add_flag("--pin", pin, "Pin the whole process to CPU 0, so all threads share one CPU");
  app.add_flag("--list", list, "List the registered suites and exit");
  bool no_peers = false;
  app.add_flag("--no-peers", no_peers, "Do not run the peers (PyTorch, gRPC C++); their columns say 'skipped'");
  CLI11_PARSE(app, argc, argv);

  if (list) {
    for (const auto& s : all_suites) fmt::print("{}\n", s.name);
    return 0;
  }

  // Selected suites, in registration order, each once.
  std::vector<suite_entry> selected;
  for (const auto& name : requested) {
    if (name.empty()) continue;
    if (std::none_of(all_suites.begin(), all_suites.end(), [&](const suite_entry& s) { return s.name == name; })) {
      fmt::print(stderr, "corodist-bench: unknown suite '{}' (known suites: {})\n", name, join_names(all_suites));
      return 2;
    }
  }
  for (const auto& s : all_suites)
    if (requested.empty() || std::find(requested.begin(), requested.end(), s.name) != requested.end())
      selected.push_back(s);

  // CORODIST_METRICS_PORT=0 runs every case with the metrics on (the cases
  // that use no TCP store would not start them): their cost, on and off.
  if (corodist::metrics::start_from_environment() != 0)
    fmt::print(stderr, "corodist-bench: metrics on, at http://127.0.0.1:{}/metrics\n", corodist::metrics::metrics_server::port());

  cb::context ctx;
  ctx.quick = quick;
  ctx.peers = !no_peers;
  ctx.backend = cb::backend_name();

  std::unique_ptr<std::FILE, file_closer> json_file;
  if (json_path == "-") {
    ctx.json_out = stdout;
    ctx.table_out = stderr;
  } else if (!json_path.empty()) {
    json_file.reset(std::fopen(json_path.c_str(), "w"));
    if (!json_file) {
      fmt::print(stderr, "corodist-bench: cannot open '{}' for writing: {}\n", json_path, std::strerror(errno));
      return 1;
    }
    ctx.json_out = json_file.get();
  }

  if (pin) {
    if (cb::pin_process_to_one_cpu("corodist-bench") < 0) return 1;
    ctx.pinned = true;
  }

  try {
    fmt::print(ctx.table_out, "# measuring raw floor (64 B TCP ping-pong, bulk)...\n");
    std::fflush(ctx.table_out);
    ctx.raw_p50_us = cb::measure_raw_floor(quick);
    ctx.raw_gbytes_per_s = cb::measure_raw_bulk(quick);
  } catch (const std::exception& e) {
    fmt::print(stderr, "corodist-bench: raw floor failed: {}\n", e.what());
    return 1;
  }
  ctx.print_header();

  cb::progress status(selected);
  ctx.status = &status;
  int rc = 0;
  for (std::size_t i = 0; i < selected.size(); ++i) {
    const auto& s = selected[i];
    status.suite_started(i);
    try {
      s.fn(ctx);
    } catch (const std::exception& e) {
      std::fflush(ctx.table_out);
      status.pause();
      fmt::print(stderr, "corodist-bench: suite '{}' failed: {}\n", s.name, e.what());
      rc = 1;
    }
  }
  return rc;
}
