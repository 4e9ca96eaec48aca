// The streams of one agent: opening one (a request through the agent's
// channels, so a dial, a lost peer and the open's deadline behave as for a
// call), serving an open (the stream function's coroutine on the loop), and
// routing the frames that follow to the stream's end.
#include "rpc/stream_table.hpp"

#include <corodist/core/error.hpp>
#include <corodist/core/little_endian.hpp>
#include <corodist/rpc/errors.hpp>

#include "core/log.hpp"
#include "rpc/agent_core.hpp"
#include "rpc/error_reply.hpp"
#include "rpc/protocol.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>

#include <vector>

namespace corodist::rpc::detail {

namespace {
using clock = std::chrono::steady_clock;

const msgpack::object& field(const msgpack::object& body, std::size_t i) { return body.via.array.ptr[i]; }
} // namespace

stream_table::stream_table(std::size_t window_items, std::size_t window_bytes)
    : window_items_(std::max<std::size_t>(window_items, 1)), window_bytes_(std::max<std::size_t>(window_bytes, 1)) {}

void stream_table::add_function(std::string name, stream_function f) {
  if (!functions_.emplace(name, std::move(f)).second)
    throw usage_error("rpc: stream function '" + name + "' is already registered");
}

void stream_table::open(std::shared_ptr<stream_core> core, payload body, corodist::deadline by) {
  auto owner = owner_.lock();
  const int rank = core->peer();
  if (!owner || closed_ || !owner->outgoing_.try_enter()) {
    core->fail(std::make_exception_ptr(usage_error(core->what() + ": the agent is not running")), false);
    return;
  }
  core->set_table(weak_from_this());
  clients_[core->id()] = core;
  ++open_count_;
  core->arm_deadline(by);
  owner->start_message(
      rank, kind_stream_open, std::move(body), by,
      [w = weak_from_this(), core, rank](std::exception_ptr error, net::bytes&& reply) {
        auto self = w.lock();
        auto owner = self ? self->owner_.lock() : nullptr;
        if (!owner) {
          core->fail(std::make_exception_ptr(connection_error(core->what() + ": the agent closed")), false);
          return;
        }
        if (error) {
          core->fail(error, false);
          return;
        }
        auto conn = owner->channels_ ? owner->channels_->connection_to(rank) : nullptr;
        if (!conn) {
          core->fail(std::make_exception_ptr(connection_error(core->what() + ": the connection closed")), false);
          return;
        }
        try {
          codec_context ctx;
          auto p = parse_payload(std::move(reply), ctx);
          const auto window = p.body.get().as<std::pair<std::uint64_t, std::uint64_t>>();
          core->attach(conn);
          core->grant_initial(window.first, window.second);
        } catch (const std::exception& e) {
          core->fail(std::make_exception_ptr(protocol_error(core->what() + ": a malformed open reply: " + e.what())),
                     true);
        }
      },
      core->what());
}

void stream_table::on_client_frame(int rank, const std::shared_ptr<net::connection>& conn, net::message&& m) {
  if (m.payload.size() < 8)
    return;
  auto it = clients_.find(corodist::load_le<std::uint64_t>(m.payload.data()));
  if (it == clients_.end() || it->second->peer() != rank)
    return; // (a stream that ended here: late frames are dropped)
  auto core = it->second;
  core->on_frame(m.header.kind, std::move(m.payload), conn);
}

void stream_table::on_server_frame(int from, const std::string& from_name, const std::shared_ptr<net::connection>& conn,
                                   net::message&& m) {
  if (m.header.kind == kind_stream_open) {
    if (!(m.header.flags & net::frame_flags::one_way))
      serve_open(from, from_name, conn, std::move(m), clock::now());
    return;
  }
  if (m.payload.size() < 8)
    return;
  auto it = servers_.find(server_key{conn.get(), corodist::load_le<std::uint64_t>(m.payload.data())});
  if (it == servers_.end())
    return;
  auto core = it->second;
  core->on_frame(m.header.kind, std::move(m.payload), conn);
}

void stream_table::serve_open(int from, const std::string& from_name_in, const std::shared_ptr<net::connection>& conn,
                              net::message&& m, clock::time_point arrived) {
  const auto rid = m.header.request_id;
  auto owner = owner_.lock();
  if (!owner)
    return;
  const auto& self_name = owner->opts_.name;
  auto answer_failure = [&](failure code, const std::string& type, const std::string& message) {
    auto p = encode_failure(code, type, message);
    conn->respond(rid, kind_error_reply, std::move(p.body), std::move(p.attachments));
  };
  bool entered = false;
  try {
    codec_context ctx;
    owner->decode_context(from, ctx);
    auto p = parse_payload(std::move(m.payload), ctx);
    const auto& body = p.body.get();
    if (body.type != msgpack::type::ARRAY || body.via.array.size != 8 ||
        field(body, 0).type != msgpack::type::POSITIVE_INTEGER || field(body, 1).type != msgpack::type::STR ||
        field(body, 2).type != msgpack::type::ARRAY || field(body, 3).type != msgpack::type::POSITIVE_INTEGER ||
        field(body, 4).type != msgpack::type::POSITIVE_INTEGER || field(body, 5).type != msgpack::type::POSITIVE_INTEGER ||
        field(body, 6).type != msgpack::type::POSITIVE_INTEGER || field(body, 7).type != msgpack::type::MAP)
      throw call_failure(failure::malformed, "a stream open is not [id, name, [args], timeout_ms, mode, window_items, "
                                             "window_bytes, {metadata}]");
    const auto id = field(body, 0).as<std::uint64_t>();
    const std::string name = field(body, 1).as<std::string>();
    const auto deadline = corodist::deadline::from_wire(field(body, 3).as<std::uint64_t>(), arrived);
    const auto mode = static_cast<stream_mode>(field(body, 4).as<std::uint8_t>());
    const auto peer_items = field(body, 5).as<std::uint64_t>();
    const auto peer_bytes = field(body, 6).as<std::uint64_t>();
    call_metadata metadata;
    try {
      metadata = field(body, 7).as<std::vector<std::pair<std::string, std::string>>>();
    } catch (const std::exception&) {
      const auto& map = field(body, 7).via.map;
      for (std::uint32_t i = 0; i < map.size; ++i)
        metadata.emplace_back(map.ptr[i].key.as<std::string>(), map.ptr[i].val.as<std::string>());
    }
    auto fit = functions_.find(name);
    if (fit == functions_.end())
      throw call_failure(failure::unknown_function,
                         "no stream function '" + name + "' is registered on worker '" + self_name + "'");
    if (fit->second.mode != mode)
      throw call_failure(failure::bad_arguments,
                         "stream function '" + name + "' is " +
                             (fit->second.mode == stream_mode::bidi ? "bidirectional: open it with open_bidi"
                                                                    : "server streaming: open it with open_stream"));
    if (deadline.expired())
      throw call_failure(failure::deadline, "stream '" + name + "' was not started: its caller's deadline had passed");
    if (servers_.count(server_key{conn.get(), id}))
      throw call_failure(failure::malformed, "stream id " + std::to_string(id) + " is already open");
    if (closed_ || !owner->dispatcher_->serving().try_enter())
      throw call_failure(failure::exception, "worker '" + self_name + "' is shutting down");
    entered = true;
    std::string from_name = from_name_in;
    if (from_name.empty() && from >= 0 && owner->registry_.table() &&
        from < static_cast<int>(owner->registry_.table()->by_rank.size()))
      from_name = owner->registry_.lookup(from).name;
    auto state = std::make_shared<detail::call_state>();
    state->deadline = deadline;
    state->metadata = std::move(metadata);
    call_context cc(from, from_name, deadline, state);
    auto core = std::make_shared<stream_core>(owner->ex_, stream_core::role::server, id, from,
                                              "stream '" + name + "' from worker '" + from_name + "'", mode,
                                              window_items_, window_bytes_);
    core->set_call_state(std::move(state));
    core->set_port(owner.get(), owner->opts_.rank, from_name);
    core->attach(conn);
    core->grant_initial(peer_items, peer_bytes);
    asio::awaitable<void> coro;
    {
      codec_scope scope(ctx);
      try {
        coro = fit->second.bind(field(body, 2), std::move(cc), core);
      } catch (const std::exception& e) {
        throw call_failure(failure::bad_arguments, "stream function '" + name + "': " + e.what());
      }
    }
    core->set_table(weak_from_this());
    servers_[server_key{conn.get(), id}] = core;
    ++open_count_;
    {
      encoder e(owner.get(), owner->opts_.rank, from);
      auto& pk = e.packer();
      pk.pack_array(2);
      pk.pack(static_cast<std::uint64_t>(window_items_));
      pk.pack(static_cast<std::uint64_t>(window_bytes_));
      auto reply = e.finish();
      conn->respond(rid, kind_reply, std::move(reply.body), std::move(reply.attachments));
    }
    core->arm_deadline(deadline);
    core->set_handler_running(true);
    asio::co_spawn(owner->ex_, std::move(coro),
                   asio::bind_cancellation_slot(core->handler_signal().slot(),
                                                [core, self_name](std::exception_ptr e) {
                                                  if (e)
                                                    core->fail_write(e, self_name);
                                                  else
                                                    core->close_write();
                                                  core->handler_done();
                                                }));
  } catch (const call_failure& f) {
    if (entered)
      owner->dispatcher_->serving().leave();
    if (f.code == failure::malformed)
      CORODIST_LOG_WARN("rpc: malformed stream open from rank {}: {}", from, f.what());
    answer_failure(f.code, f.code == failure::malformed ? "protocol_error" : "rpc", f.what());
  } catch (const protocol_error& e) {
    if (entered)
      owner->dispatcher_->serving().leave();
    CORODIST_LOG_WARN("rpc: malformed stream open from rank {}: {}", from, e.what());
    answer_failure(failure::malformed, "protocol_error", e.what());
  } catch (const std::exception& e) {
    if (entered)
      owner->dispatcher_->serving().leave();
    answer_failure(failure::malformed, "protocol_error", e.what());
  }
}

void stream_table::on_closed(const net::connection* conn, int rank) {
  std::vector<std::shared_ptr<stream_core>> servers, clients;
  for (auto& [k, c] : servers_)
    if (k.conn == conn)
      servers.push_back(c);
  for (auto& [id, c] : clients_)
    if (c->connection().get() == conn)
      clients.push_back(c);
  for (auto& c : servers)
    c->fail(std::make_exception_ptr(connection_error(c->what() + ": the caller's connection closed")), false);
  if (clients.empty())
    return;
  auto owner = owner_.lock();
  const auto* lost = owner && owner->channels_ ? owner->channels_->lost(rank) : nullptr;
  for (auto& c : clients) {
    std::exception_ptr e;
    if (lost)
      e = std::make_exception_ptr(peer_lost_error(owner->registry_.lookup(rank).name, rank, lost->reason, c->what()));
    else
      e = std::make_exception_ptr(connection_error(c->what() + ": the connection closed"));
    c->fail(e, false, /*at_once=*/false);
  }
}

void stream_table::release(stream_core& c) {
  auto owner = owner_.lock();
  if (c.side() == stream_core::role::client) {
    if (clients_.erase(c.id()) > 0) {
      --open_count_;
      if (owner)
        owner->outgoing_.leave();
    }
  } else if (servers_.erase(server_key{c.connection().get(), c.id()}) > 0) {
    --open_count_;
    if (owner)
      owner->dispatcher_->serving().leave();
  }
}

void stream_table::close_all() {
  closed_ = true;
  std::vector<std::shared_ptr<stream_core>> all;
  for (auto& [k, c] : servers_)
    all.push_back(c);
  for (auto& [id, c] : clients_)
    all.push_back(c);
  for (auto& c : all)
    c->fail(std::make_exception_ptr(connection_error(c->what() + ": the agent is shut down")), false);
}

} // namespace corodist::rpc::detail
