/// \file
/// corodist-grpc-peer: the gRPC C++ peer of corodist-bench's rpc suite (Debian's
/// libgrpc++, callback server, generated protobuf stub), in one process over
/// loopback like the rpc suite's two agents. Prints one JSON object per figure:
///   sync_unary_64B   p50/p99 of a blocking unary call with 64 B of payload
///   async_x64        calls/s with 64 callback-API calls in flight
///   echo             GB/s of an N-byte echo (2 x N / median round trip)
///
///   corodist-grpc-peer [--samples S] [--calls C] [--echo-bytes N] [--rounds R]

#include "echo.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
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
  CLI11_PARSE(app, argc, argv);
  try {
    echo_service service;
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    builder.SetMaxReceiveMessageSize(-1);
    builder.SetMaxSendMessageSize(-1);
    auto server = builder.BuildAndStart();
    if (!server || port == 0) throw std::runtime_error("gRPC server did not start");

    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                             grpc::InsecureChannelCredentials(), args);
    auto stub = corodist_bench::Echo::NewStub(channel);

    auto lat = sync_latencies(*stub, 64, samples, std::max<std::size_t>(samples / 10, 10));
    std::printf("{\"op\":\"sync_unary_64B\",\"p50_us\":%.3f,\"p99_us\":%.3f,\"samples\":%zu}\n", percentile(lat, 0.5),
                percentile(lat, 0.99), lat.size());
    std::fflush(stdout);

    const double per_s = async_throughput(*stub, 64, calls);
    std::printf("{\"op\":\"async_x64\",\"ops_per_s\":%.1f,\"in_flight\":64,\"calls\":%zu}\n", per_s, calls);
    std::fflush(stdout);

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
