// A program outside corodist, built against an installed corodist by
// tests/install/check_install.sh (pkg-config with g++ and clang++, and CMake's
// find_package): a store server and a client on one loop, set and get. With
// --nccl it prints why NCCL cannot run here ("" if it can), which loads the
// CUDA plugin installed beside the library.
#include <corodist/collective/nccl_group.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>

#include <cstdio>
#include <string>

asio::awaitable<std::string> set_and_get(corodist::event_loop& loop, unsigned short port) {
  corodist::store::tcp_store_options opts;
  opts.port = port;
  auto store = co_await corodist::store::tcp_store::connect(loop.get_executor(), opts);
  co_await store->set("greeting", "hello from an installed corodist");
  co_return co_await store->get("greeting");
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--nccl") {
    std::printf("nccl: %s\n", corodist::collective::nccl_group::unavailable_reason().c_str());
    return 0;
  }
  corodist::event_loop loop;
  loop.start();
  auto server = corodist::store::store_server::start(loop.get_executor(), {});
  auto value = corodist::run_blocking(loop.get_executor(), set_and_get(loop, server->local_endpoint().port()));
  std::printf("%s (%s)\n", value.c_str(), std::string(corodist::event_loop::backend()).c_str());
  return value == "hello from an installed corodist" ? 0 : 1;
}
