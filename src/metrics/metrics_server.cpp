// The process's metrics endpoint: a prometheus-cpp Exposer (civetweb) serving
// the process registry and the connection counts, the recorders' observer
// installed while it runs, and the start from CORODIST_METRICS_PORT.
#include <corodist/metrics/metrics_server.hpp>

#include "core/log.hpp"
#include "metrics/connection_collector.hpp"
#include "metrics/process_metrics.hpp"

#include <corodist/core/error.hpp>

#include <prometheus/exposer.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>

namespace corodist::metrics {

namespace {

struct server_state {
  std::mutex mutex;
  std::unique_ptr<prometheus::Exposer> exposer;
  std::shared_ptr<detail::connection_collector> connections = std::make_shared<detail::connection_collector>();
  std::atomic<std::uint16_t> port{0};
  std::atomic<bool> counting{false};
};

server_state& state() {
  static auto* s = new server_state(); // never destroyed: recorders may end entries at exit
  return *s;
}

/// Writes `port` to `path` through a temporary file and a rename (a reader sees the whole number or no file).
void write_port_file(const std::string& path, std::uint16_t port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << '\n';
    if (!out.flush())
      throw corodist::error("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    throw corodist::error("cannot rename " + tmp + " to " + path + ": " + ec.message());
}

} // namespace

std::uint16_t metrics_server::start(std::uint16_t port, const std::string& bind) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  if (s.exposer)
    return s.port.load();
  const std::string address = (bind.find(':') != std::string::npos ? "[" + bind + "]" : bind) + ":" +
                              std::to_string(port);
  std::unique_ptr<prometheus::Exposer> e;
  try {
    e = std::make_unique<prometheus::Exposer>(address, 2);
  } catch (const std::exception& ex) {
    throw corodist::error("metrics: cannot serve on " + address + ": " + ex.what());
  }
  const auto ports = e->GetListeningPorts();
  if (ports.empty())
    throw corodist::error("metrics: civetweb bound no port on " + address);
  auto& pm = detail::process_metrics::instance();
  e->RegisterCollectable(pm.registry());
  e->RegisterCollectable(s.connections);
  flight_recorder::set_observer(
      [&pm](const flight_recorder& r, const record_entry& entry) { pm.on_entry(r, entry); });
  s.counting.store(true, std::memory_order_release);
  s.exposer = std::move(e);
  s.port.store(static_cast<std::uint16_t>(ports.front()));
  CORODIST_LOG_INFO("metrics: serving http://{}:{}/metrics", bind, ports.front());
  return s.port.load();
}

std::uint16_t metrics_server::port() noexcept { return state().port.load(); }

void metrics_server::stop() noexcept {
  auto& s = state();
  std::unique_ptr<prometheus::Exposer> e;
  {
    std::lock_guard lock(s.mutex);
    if (!s.exposer)
      return;
    flight_recorder::set_observer(nullptr);
    s.counting.store(false, std::memory_order_release);
    e = std::move(s.exposer);
    s.port.store(0);
  }
  e.reset(); // joins civetweb's threads, outside the lock
}

std::uint16_t start_from_environment() noexcept {
  static std::once_flag once;
  std::uint16_t bound = 0;
  std::call_once(once, [&] {
    const char* env = std::getenv(port_variable);
    if (!env || !*env)
      return;
    try {
      unsigned port = 0;
      const char* end = env + std::strlen(env);
      auto [p, ec] = std::from_chars(env, end, port);
      if (ec != std::errc{} || p != end || port > 65535)
        throw corodist::error(std::string(port_variable) + "='" + env + "' is not a port number (0-65535)");
      const char* bind = std::getenv("CORODIST_METRICS_BIND");
      bound = metrics_server::start(static_cast<std::uint16_t>(port), bind && *bind ? bind : "127.0.0.1");
      if (const char* file = std::getenv(port_file_variable); file && *file)
        write_port_file(file, bound);
    } catch (const std::exception& e) {
      try {
        CORODIST_LOG_WARN("metrics: not started: {}", e.what());
      } catch (...) {
      }
    }
  });
  return bound;
}

std::string scrape_text() {
  auto& s = state();
  std::vector<prometheus::MetricFamily> families = detail::process_metrics::instance().registry()->Collect();
  for (auto& f : s.connections->Collect())
    families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

bool counting() noexcept { return state().counting.load(std::memory_order_acquire); }

} // namespace corodist::metrics
