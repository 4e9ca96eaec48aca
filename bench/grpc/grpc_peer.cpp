/// \file
/// corodist-grpc-peer: the gRPC C++ peer of corodist-bench's rpc suite (Debian's
/// libgrpc++, callback server, generated protobuf stub), in one process over
/// loopback like the rpc suite's two agents. Prints one JSON object per figure:
///   sync_unary_64B   p50/p99 of a blocking unary call with 64 B of payload
///   async_x64        calls/s with 64 callback-API calls in flight
///   echo             GB/s of an N-byte echo (2 x N / median round trip)
/// and of server streaming (a callback ServerWriteReactor, read with a
/// blocking ClientReader):
///   stream_64B       items/s of one stream of 64 B items (the better of
///                    plain writes and writes with buffer_hint; both given)
///   stream_64KiB     items/s (and GB/s) of one stream of 64 KiB items
///   stream_latency_64B  p50/p99 from the handler's write to the client's
///                    read, items written every --interval-us
///
/// With --tls-dir DIR the channel is a secure one, mutual TLS with the
/// certificates of scripts/make_test_certs.sh in DIR (server.pem/.key,
/// client.pem/.key, ca.pem): grpc::SslServerCredentials requiring and
/// verifying the client's, grpc::SslCredentials on the client. --no-async
/// leaves out async_x64.
///
///   corodist-grpc-peer [--cases unary|streams|all] [--samples S] [--calls C] [--echo-bytes N] [--rounds R]
///                      [--tls-dir DIR] [--no-async] [--stream-items N] [--stream-big-items N] [--latency-items N]
///                      [--interval-us U]

#include "echo.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch()).count());
}

// Writes the request's items one at a time (a reactor has one write in flight).
class stream_reactor final : public grpc::ServerWriteReactor<corodist_bench::Item> {
public:
  explicit stream_reactor(const corodist_bench::StreamRequest* r)
      : left_(r->count()), interval_ns_(r->interval_ns()) {
    item_.set_data(std::string(r->bytes(), 'x'));
    if (r->buffer_hint())
      options_.set_buffer_hint();
    next();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    next();
  }
  void OnDone() override { delete this; }

private:
  void next() {
    if (left_ == 0) {
      Finish(grpc::Status::OK);
      return;
    }
    --left_;
    if (interval_ns_ > 0) { // paced: this callback thread sleeps until the item's time
      const auto now = now_ns();
      if (now < due_ns_)
        std::this_thread::sleep_for(std::chrono::nanoseconds(due_ns_ - now));
      due_ns_ = now_ns() + interval_ns_;
    }
    item_.set_sent_ns(now_ns());
    StartWrite(&item_, options_);
  }
  std::uint64_t left_;
  std::uint64_t interval_ns_;
  std::uint64_t due_ns_ = 0;
  corodist_bench::Item item_;
  grpc::WriteOptions options_;
};

class echo_service final : public corodist_bench::Echo::CallbackService {
  grpc::ServerWriteReactor<corodist_bench::Item>* Stream(grpc::CallbackServerContext*,
                                                         const corodist_bench::StreamRequest* request) override {
    return new stream_reactor(request);
  }
  grpc::ServerUnaryReactor* Call(grpc::CallbackServerContext* ctx, const corodist_bench::Blob* request,
                                 corodist_bench::Blob* response) override {
    *response->mutable_data() = request->data();
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

double percentile(std::vector<double>& v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

double us_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void check(const grpc::Status& s) {
  if (!s.ok()) throw std::runtime_error("gRPC call failed: " + s.error_message());
}

// Blocking unary calls, one at a time.
std::vector<double> sync_latencies(corodist_bench::Echo::Stub& stub, std::size_t bytes, std::size_t samples,
                                   std::size_t warmup) {
  corodist_bench::Blob req, resp;
  req.set_data(std::string(bytes, 'x'));
  std::vector<double> lat;
  lat.reserve(samples);
  for (std::size_t i = 0; i < warmup + samples; ++i) {
    grpc::ClientContext ctx;
    auto t0 = clock_type::now();
    check(stub.Call(&ctx, req, &resp));
    if (i >= warmup) lat.push_back(us_since(t0));
    if (resp.data().size() != bytes) throw std::runtime_error("echo size mismatch");
  }
  return lat;
}

// `depth` callback calls in flight until `total` have completed; returns calls/s.
double async_throughput(corodist_bench::Echo::Stub& stub, int depth, std::size_t total) {
  struct slot {
    grpc::ClientContext ctx;
    corodist_bench::Blob req, resp;
  };
  std::mutex m;
  std::condition_variable cv;
  std::size_t issued = 0, done = 0;
  std::string failure;
  std::function<void()> issue;
  issue = [&] {
    auto s = std::make_shared<slot>();
    s->req.set_data(std::string(64, 'x'));
    s->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stub.async()->Call(&s->ctx, &s->req, &s->resp, [&, s](grpc::Status st) {
      bool again = false;
      {
        std::lock_guard lock(m);
        ++done;
        if (!st.ok() && failure.empty()) failure = st.error_message();
        if (issued < total && failure.empty()) {
          ++issued;
          again = true;
        }
        if (done == issued) cv.notify_all();
      }
      if (again) issue();
    });
  };
  auto t0 = clock_type::now();
  {
    std::lock_guard lock(m);
    issued = static_cast<std::size_t>(depth);
  }
  for (int i = 0; i < depth; ++i) issue();
  std::unique_lock lock(m);
  if (!cv.wait_for(lock, std::chrono::seconds(300), [&] { return done == issued && (issued == total || !failure.empty()); }))
    throw std::runtime_error("async calls did not finish within 300 s");
  if (!failure.empty()) throw std::runtime_error("gRPC call failed: " + failure);
  return static_cast<double>(done) / (us_since(t0) * 1e-6);
}

struct stream_run {
  double items_per_s = 0;
  std::vector<double> latency_us; // write to read, per item
};

// One stream of `count` items of `bytes`, read to its end on this thread.
stream_run read_stream(corodist_bench::Echo::Stub& stub, std::uint64_t count, std::uint64_t bytes,
                       std::uint64_t interval_ns, bool hint) {
  corodist_bench::StreamRequest req;
  req.set_count(count);
  req.set_bytes(bytes);
  req.set_interval_ns(interval_ns);
  req.set_buffer_hint(hint);
  grpc::ClientContext ctx;
  stream_run out;
  if (interval_ns > 0)
    out.latency_us.reserve(count);
  corodist_bench::Item item;
  std::uint64_t n = 0;
  const auto t0 = clock_type::now();
  auto reader = stub.Stream(&ctx, req);
  while (reader->Read(&item)) {
    if (interval_ns > 0)
      out.latency_us.push_back(static_cast<double>(now_ns() - item.sent_ns()) / 1e3);
    if (item.data().size() != bytes) throw std::runtime_error("stream item size mismatch");
    ++n;
  }
  check(reader->Finish());
  if (n != count) throw std::runtime_error("stream ended after " + std::to_string(n) + " items");
  out.items_per_s = static_cast<double>(n) / (us_since(t0) * 1e-6);
  return out;
}

void stream_cases(corodist_bench::Echo::Stub& stub, std::uint64_t items, std::uint64_t big_items,
                  std::uint64_t latency_items, std::uint64_t interval_us) {
  read_stream(stub, std::max<std::uint64_t>(items / 10, 100), 64, 0, false); // warm-up
  const double plain = read_stream(stub, items, 64, 0, false).items_per_s;
  const double hinted = read_stream(stub, items, 64, 0, true).items_per_s;
  std::printf("{\"op\":\"stream_64B\",\"items_per_s\":%.1f,\"plain_items_per_s\":%.1f,"
              "\"buffer_hint_items_per_s\":%.1f,\"items\":%llu}\n",
              std::max(plain, hinted), plain, hinted, static_cast<unsigned long long>(items));
  std::fflush(stdout);
  const std::uint64_t big = 64 * 1024;
  const double big_plain = read_stream(stub, big_items, big, 0, false).items_per_s;
  const double big_hinted = read_stream(stub, big_items, big, 0, true).items_per_s;
  const double best = std::max(big_plain, big_hinted);
  std::printf("{\"op\":\"stream_64KiB\",\"items_per_s\":%.1f,\"gbytes_per_s\":%.4f,\"plain_items_per_s\":%.1f,"
              "\"buffer_hint_items_per_s\":%.1f,\"items\":%llu}\n",
              best, best * static_cast<double>(big) / 1e9, big_plain, big_hinted,
              static_cast<unsigned long long>(big_items));
  std::fflush(stdout);
  auto lat = read_stream(stub, latency_items, 64, interval_us * 1000, false).latency_us;
  std::printf("{\"op\":\"stream_latency_64B\",\"p50_us\":%.3f,\"p99_us\":%.3f,\"samples\":%zu,"
              "\"interval_us\":%llu}\n",
              percentile(lat, 0.5), percentile(lat, 0.99), lat.size(), static_cast<unsigned long long>(interval_us));
  std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"gRPC C++ peer of corodist-bench"};
  std::size_t samples = 20000, calls = 200000, echo_bytes = std::size_t{64} << 20, rounds = 10;
  app.add_option("--samples", samples, "timed sync unary calls")->capture_default_str();
  app.add_option("--calls", calls, "calls in the 64-in-flight run")->capture_default_str();
  app.add_option("--echo-bytes", echo_bytes, "payload of the echo case")->capture_default_str();
  app.add_option("--rounds", rounds, "timed echoes")->capture_default_str();
  std::string tls_dir;
  bool no_async = false;
  app.add_option("--tls-dir", tls_dir, "mutual TLS with the certificates in this directory");
  app.add_flag("--no-async", no_async, "leave out async_x64");
  std::string cases = "all";
  std::uint64_t stream_items = 1000000, stream_big_items = 20000, latency_items = 20000, interval_us = 50;
  app.add_option("--cases", cases, "unary, streams or all")->capture_default_str();
  app.add_option("--stream-items", stream_items, "64 B items of the stream case")->capture_default_str();
  app.add_option("--stream-big-items", stream_big_items, "64 KiB items of the stream case")->capture_default_str();
  app.add_option("--latency-items", latency_items, "items of the stream latency case")->capture_default_str();
  app.add_option("--interval-us", interval_us, "between items of the stream latency case")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    echo_service service;
    grpc::ServerBuilder builder;
    int port = 0;
    std::shared_ptr<grpc::ServerCredentials> server_creds = grpc::InsecureServerCredentials();
    std::shared_ptr<grpc::ChannelCredentials> channel_creds = grpc::InsecureChannelCredentials();
    if (!tls_dir.empty()) {
      grpc::SslServerCredentialsOptions so(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
      so.pem_root_certs = read_file(tls_dir + "/ca.pem");
      so.pem_key_cert_pairs.push_back({read_file(tls_dir + "/server.key"), read_file(tls_dir + "/server.pem")});
      server_creds = grpc::SslServerCredentials(so);
      grpc::SslCredentialsOptions co;
      co.pem_root_certs = read_file(tls_dir + "/ca.pem");
      co.pem_private_key = read_file(tls_dir + "/client.key");
      co.pem_cert_chain = read_file(tls_dir + "/client.pem");
      channel_creds = grpc::SslCredentials(co);
    }
    builder.AddListeningPort("127.0.0.1:0", server_creds, &port);
    builder.RegisterService(&service);
    builder.SetMaxReceiveMessageSize(-1);
    builder.SetMaxSendMessageSize(-1);
    auto server = builder.BuildAndStart();
    if (!server || port == 0) throw std::runtime_error("gRPC server did not start");

    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    if (!tls_dir.empty())
      args.SetSslTargetNameOverride("localhost"); // a name of the server's certificate
    auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), channel_creds, args);
    auto stub = corodist_bench::Echo::NewStub(channel);
    if (cases == "streams" || cases == "all")
      stream_cases(*stub, stream_items, stream_big_items, latency_items, interval_us);
    if (cases == "streams") {
      server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
      return 0;
    }

    auto lat = sync_latencies(*stub, 64, samples, std::max<std::size_t>(samples / 10, 10));
    std::printf("{\"op\":\"sync_unary_64B\",\"p50_us\":%.3f,\"p99_us\":%.3f,\"samples\":%zu}\n", percentile(lat, 0.5),
                percentile(lat, 0.99), lat.size());
    std::fflush(stdout);

    if (!no_async) {
      const double per_s = async_throughput(*stub, 64, calls);
      std::printf("{\"op\":\"async_x64\",\"ops_per_s\":%.1f,\"in_flight\":64,\"calls\":%zu}\n", per_s, calls);
      std::fflush(stdout);
    }

    auto echo = sync_latencies(*stub, echo_bytes, rounds, 1);
    const double p50 = percentile(echo, 0.5);
    std::printf("{\"op\":\"echo\",\"bytes\":%zu,\"p50_us\":%.1f,\"gbytes_per_s\":%.4f}\n", echo_bytes, p50,
                2.0 * static_cast<double>(echo_bytes) / (p50 * 1e-6) / 1e9);
    std::fflush(stdout);
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "corodist-grpc-peer: %s\n", e.what());
    return 1;
  }
}
