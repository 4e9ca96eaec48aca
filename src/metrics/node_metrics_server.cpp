// The node's endpoint (node_metrics.hpp): civetweb serves /metrics; each
// request fetches every listed rank's exposition with civetweb's client and
// merges them.
#include <corodist/metrics/node_metrics.hpp>

#include <corodist/core/error.hpp>

#include <civetweb.h>

#include <map>
#include <mutex>

namespace corodist::metrics {

namespace {

/// civetweb's library set up once per process (client and server alike).
void init_civetweb() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

} // namespace

std::string fetch_metrics(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout) {
  init_civetweb();
  char ebuf[256] = {};
  const std::string where = host + ":" + std::to_string(port);
  mg_connection* c = mg_connect_client(host.c_str(), port, 0, ebuf, sizeof ebuf);
  if (!c)
    throw corodist::error("metrics: cannot connect to " + where + ": " + ebuf);
  struct closer {
    mg_connection* c;
    ~closer() { mg_close_connection(c); }
  } close_it{c};
  mg_printf(c, "GET /metrics HTTP/1.0\r\nHost: %s\r\nAccept: text/plain\r\n\r\n", where.c_str());
  if (mg_get_response(c, ebuf, sizeof ebuf, static_cast<int>(timeout.count())) < 0)
    throw corodist::error("metrics: no response from " + where + ": " + ebuf);
  const mg_response_info* info = mg_get_response_info(c);
  if (!info || info->status_code != 200)
    throw corodist::error("metrics: " + where + " answered status " + std::to_string(info ? info->status_code : 0));
  std::string body;
  char buf[16384];
  for (;;) {
    const int n = mg_read(c, buf, sizeof buf);
    if (n < 0)
      throw corodist::error("metrics: reading from " + where + " failed");
    if (n == 0)
      break;
    body.append(buf, static_cast<std::size_t>(n));
  }
  return body;
}

struct node_metrics_server::impl {
  source list;
  mg_context* ctx = nullptr;
  std::uint16_t port = 0;
  std::mutex mutex; // one scrape at a time; the error counts
  std::map<int, std::uint64_t> errors;

  std::string scrape() {
    std::lock_guard lock(mutex);
    std::vector<rank_exposition> parts;
    for (const auto& ep : list()) {
      try {
        parts.push_back({ep.rank, fetch_metrics("127.0.0.1", ep.port, std::chrono::seconds(5))});
      } catch (const std::exception&) {
        ++errors[ep.rank];
      }
    }
    std::string out = merge_expositions(parts);
    out += "# HELP corodist_node_scrape_errors_total Ranks' endpoints that did not answer this node's scrape\n"
           "# TYPE corodist_node_scrape_errors_total counter\n";
    for (const auto& [rank, n] : errors)
      out += "corodist_node_scrape_errors_total{rank=\"" + std::to_string(rank) + "\"} " + std::to_string(n) + "\n";
    return out;
  }

  static int handle(mg_connection* c, void* self) {
    std::string body;
    int status = 200;
    try {
      body = static_cast<impl*>(self)->scrape();
    } catch (const std::exception& e) {
      status = 500;
      body = std::string(e.what()) + "\n";
    }
    mg_printf(c,
              "HTTP/1.1 %d %s\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
              "Content-Length: %zu\r\nConnection: close\r\n\r\n",
              status, status == 200 ? "OK" : "Internal Server Error", body.size());
    mg_write(c, body.data(), body.size());
    return status;
  }
};

node_metrics_server::node_metrics_server(std::uint16_t port, const std::string& bind, source s)
    : impl_(std::make_unique<impl>()) {
  init_civetweb();
  impl_->list = std::move(s);
  const std::string address = (bind.find(':') != std::string::npos ? "[" + bind + "]" : bind) + ":" +
                              std::to_string(port);
  const char* options[] = {"listening_ports", address.c_str(), "num_threads", "2", nullptr};
  mg_callbacks callbacks{};
  impl_->ctx = mg_start(&callbacks, nullptr, options);
  if (!impl_->ctx)
    throw corodist::error("metrics: cannot serve the node's metrics on " + address);
  mg_set_request_handler(impl_->ctx, "/metrics", &impl::handle, impl_.get());
  mg_server_port ports[4] = {};
  if (mg_get_server_ports(impl_->ctx, 4, ports) < 1) {
    mg_stop(impl_->ctx);
    throw corodist::error("metrics: civetweb bound no port on " + address);
  }
  impl_->port = static_cast<std::uint16_t>(ports[0].port);
}

node_metrics_server::~node_metrics_server() {
  if (impl_ && impl_->ctx)
    mg_stop(impl_->ctx);
}

std::uint16_t node_metrics_server::port() const noexcept { return impl_->port; }

} // namespace corodist::metrics
