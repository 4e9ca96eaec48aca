// corodist-store: run a standalone store server, or poke a running one.
//
//   corodist-store serve --host 127.0.0.1 --port 29500      (port 0: prints the chosen port)
//   corodist-store --port 29500 set KEY VALUE | get KEY | add KEY N | wait KEY... | keys [PREFIX] | del KEY
//   corodist-store --port 29500 verdict [--out FILE] [--prefix P]   (a running job's hang verdict)
//
// The client verbs fail at once when nothing listens on HOST:PORT (after
// retrying refused connections for `refused_window`, a server just starting).
// The connection options (--host, --port, ...) go before or after the command.

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/connect_store.hpp>
#include <corodist/store/hang_verdict.hpp>
#include <corodist/store/launch_generation.hpp>
#include <corodist/store/prefix_store.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/sync_store.hpp>

#include <CLI/CLI.hpp>
#include <asio/post.hpp>
#include <asio/signal_set.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <future>
#include <iostream>
#include <map>

namespace cs = corodist::store;

namespace {

/// How long the client verbs retry a refused connection before saying that
/// nothing is listening (documented in docs/store.md).
constexpr std::chrono::milliseconds refused_window{1000};

int serve(const std::string& host, std::uint16_t port, const std::optional<std::string>& token, bool pytorch) {
  corodist::event_loop loop;
  cs::server_options so;
  so.host = host;
  so.port = port;
  so.auth_token = token;
  so.torch_protocol = pytorch;
  auto server = cs::store_server::start(loop.get_executor(), so);
  std::promise<int> stopped;
  asio::signal_set signals(loop.context(), SIGINT, SIGTERM);
  signals.async_wait([&](std::error_code ec, int sig) {
    if (!ec) {
      std::fprintf(stderr, "corodist-store: signal %d, stopping\n", sig);
      server->stop();
      stopped.set_value(0);
    }
  });
  loop.start();
  auto ep = server->local_endpoint();
  std::printf("listening on %s:%u\n", ep.address().to_string().c_str(), unsigned(ep.port()));
  std::fflush(stdout);
  int rc = stopped.get_future().get();
  server.reset();
  loop.stop();
  return rc;
}

} // namespace

/// `verdict`: the hang verdict of the job on `store` (under `prefix`, or
/// corodist-run's current generation); 0 when no rank waits, 3 when some do.
int print_verdict(std::shared_ptr<cs::store> store, std::string prefix, const std::string& out_file,
                  corodist::timeout limit) {
  cs::sync_store s(store);
  if (prefix.empty() && s.check({cs::generation_key}))
    prefix = cs::generation_prefix(std::stoll(s.get(cs::generation_key)));
  auto job = prefix.empty() ? store : std::make_shared<cs::prefix_store>(prefix, store);
  cs::verdict_options o;
  o.gather = limit;
  auto v = corodist::run_blocking(store->get_executor(), cs::collect_hang_verdict(job, 0, o), "verdict");
  std::cout << v.text();
  if (!out_file.empty()) {
    std::ofstream out(out_file, std::ios::binary | std::ios::trunc);
    out << v.dumps_json();
    out.close();
    if (!out) {
      std::cerr << "corodist-store: cannot write " << out_file << "\n";
      return 1;
    }
    std::cerr << "every rank's flight recorder: " << out_file << "\n";
  }
  return v.waiting ? 3 : 0;
}

int main(int argc, char** argv) {
  CLI::App app{"corodist-store: standalone store server and debugging client"};
  app.set_version_flag("--version", std::string("corodist-store ") + CORODIST_VERSION);
  app.require_subcommand(1);
  app.fallthrough(); // options may also follow the subcommand
  std::string host = "127.0.0.1";
  std::uint16_t port = 29500;
  std::optional<std::string> token;
  double timeout_s = 30;
  auto protocol = cs::wire_protocol::native;
  const std::map<std::string, cs::wire_protocol> protocols{{"native", cs::wire_protocol::native},
                                                           {"pytorch-1.13", cs::wire_protocol::pytorch_1_13},
                                                           {"pytorch-2", cs::wire_protocol::pytorch_2}};
  // The connection options, on the tool (before the command) and on every command
  // (after it, and in its --help).
  auto add_connection_options = [&](CLI::App* cmd, bool client) {
    auto* g = cmd->add_option_group("Connection", "where the server is (serve: where to listen)");
    g->add_option("--host", host, "server address (serve: the address to bind)")->capture_default_str();
    g->add_option("--port", port, "server port (serve: 0 picks one and prints it)")->capture_default_str();
    g->add_option("--auth-token", token, "shared secret (default: $CORODIST_AUTH_TOKEN)");
    if (client) {
      g->add_option("--timeout", timeout_s,
                    "seconds to wait for the server and for keys (get, wait); 0: keys are awaited forever and "
                    "connecting gives up after 300 s; a refused connection fails after 1 s")
          ->check(CLI::Validator(
              [](std::string& v) {
                return v.starts_with('-') ? "a timeout is not negative (0: keys are awaited forever)" : std::string();
              },
              "SECONDS>=0"))
          ->capture_default_str();
      g->add_option("--protocol", protocol, "the server's protocol: native, pytorch-1.13 or pytorch-2")
          ->transform(CLI::CheckedTransformer(protocols).description("native|pytorch-1.13|pytorch-2"));
    }
  };
  add_connection_options(&app, true);

  auto* serve_cmd = app.add_subcommand("serve", "run the store server until SIGINT/SIGTERM");
  add_connection_options(serve_cmd, false);
  bool no_pytorch = false;
  serve_cmd->add_flag("--no-pytorch", no_pytorch, "refuse PyTorch TCPStore clients (served by default)");
  std::string key, value;
  std::int64_t delta = 1;
  std::vector<std::string> keys;
  std::string prefix;
  auto* set_cmd = app.add_subcommand("set", "set KEY VALUE");
  set_cmd->add_option("key", key)->required();
  set_cmd->add_option("value", value)->required();
  auto* get_cmd = app.add_subcommand("get", "print the value of KEY (waits for it)");
  get_cmd->add_option("key", key)->required();
  auto* add_cmd = app.add_subcommand("add", "add N to the counter KEY and print the result");
  add_cmd->add_option("key", key)->required();
  add_cmd->add_option("delta", delta)->capture_default_str();
  auto* wait_cmd = app.add_subcommand("wait", "wait until every KEY exists");
  wait_cmd->add_option("keys", keys)->required();
  auto* keys_cmd = app.add_subcommand("keys", "list the keys (with PREFIX) and their count");
  keys_cmd->add_option("prefix", prefix);
  auto* del_cmd = app.add_subcommand("del", "delete KEY");
  del_cmd->add_option("key", key)->required();
  std::string out_file, job_prefix;
  auto* verdict_cmd = app.add_subcommand(
      "verdict", "ask every rank of the job on this store for its flight recorder and print who waits where "
                 "(the ranks answer through their debug responders: under corodist-run, or started by the program)");
  verdict_cmd->add_option("--out", out_file, "write every rank's flight recorder to FILE (JSON)");
  verdict_cmd->add_option("--prefix", job_prefix,
                          "the job's key prefix (default: corodist-run's current generation when the store has one, "
                          "else none)");
  for (auto* cmd : {set_cmd, get_cmd, add_cmd, wait_cmd, keys_cmd, del_cmd, verdict_cmd})
    add_connection_options(cmd, true);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // No command recognised: name the ones there are.
    if (app.get_subcommands().empty() && !dynamic_cast<const CLI::Success*>(&e) &&
        !dynamic_cast<const CLI::CallForHelp*>(&e) && !dynamic_cast<const CLI::CallForVersion*>(&e)) {
      std::string known;
      for (const auto* cmd : app.get_subcommands({}))
        known += (known.empty() ? "" : ", ") + cmd->get_name();
      auto rest = app.remaining();
      std::cerr << "corodist-store: " << (rest.empty() ? "no command given" : "unknown command '" + rest.front() + "'")
                << "; the commands are: " << known << " (corodist-store --help)\n";
      return 2;
    }
    return app.exit(e);
  }
  try {
    if (*serve_cmd)
      return serve(host, port, token, !no_pytorch);
    corodist::event_loop loop;
    loop.start();
    cs::tcp_store_options o;
    o.host = host;
    o.port = port;
    o.auth_token = token;
    o.protocol = protocol;
    // --timeout 0: no deadline on keys; connecting still gives up after the default.
    const std::chrono::milliseconds timeout(static_cast<std::int64_t>(timeout_s * 1000));
    o.timeout = timeout.count() == 0 ? cs::default_timeout : timeout;
    o.refused_retry_window = std::min(refused_window, o.timeout.length());
    auto store = cs::connect_store_sync(loop.get_executor(), o);
    store->set_timeout(timeout.count() == 0 ? corodist::timeout::never() : corodist::timeout(timeout));
    cs::sync_store s(store);
    if (*set_cmd) {
      s.set(key, value);
    } else if (*get_cmd) {
      std::cout << s.get(key) << "\n";
    } else if (*add_cmd) {
      std::cout << s.add(key, delta) << "\n";
    } else if (*wait_cmd) {
      s.wait(keys);
    } else if (*keys_cmd) {
      for (auto& k : s.list_keys(prefix))
        std::cout << k << "\n";
      std::cerr << s.num_keys() << " keys in the store\n";
    } else if (*verdict_cmd) {
      return print_verdict(store, job_prefix, out_file, timeout.count() == 0 ? corodist::timeout(cs::verdict_options::default_gather) : corodist::timeout(timeout));
    } else if (*del_cmd) {
      if (!s.delete_key(key)) {
        std::cerr << "no such key: " << key << "\n";
        return 1;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "corodist-store: " << e.what() << "\n";
    return 1;
  }
}
