/// \file
/// corodist-grpc-peer: the gRPC C++ peer of corodist-bench's rpc suite (Debian's
/// libgrpc++, callback server, generated protobuf stub), in one process over
/// loopback like the rpc suite's two agents. Prints one JSON object per figure:
///   sync_unary_64B   p50/p99 of a blocking unary call with 64 B of payload
///   async_x64        calls/s with 64 callback-API calls in flight
///   echo             GB/s of an N-byte echo (2 x N / median round trip)
///
/// With --tls-dir DIR the channel is a secure one, mutual TLS with the
/// certificates of scripts/make_test_certs.sh in DIR (server.pem/.key,
/// client.pem/.key, ca.pem): grpc::SslServerCredentials requiring and
/// verifying the client's, grpc::SslCredentials on the client. --no-async
/// leaves out async_x64.
///
///   corodist-grpc-peer [--samples S] [--calls C] [--echo-bytes N] [--rounds R] [--tls-dir DIR] [--no-async]

#include "echo.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

class echo_service final : public corodist_bench::Echo::CallbackService {
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
