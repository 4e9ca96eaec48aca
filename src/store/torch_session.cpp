#include "store/torch_session.hpp"

#include "core/deadline.hpp"
#include "core/log.hpp"
#include "net/endpoint_text.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <cstring>

namespace corodist::store::detail {

namespace {
using corodist::detail::use_tuple;
constexpr std::size_t read_chunk = 64 * 1024;

const char* version_name(torch::version v) { return v == torch::version::v1 ? "1.13" : "2.x"; }

} // namespace

torch_session::torch_session(asio::ip::tcp::socket socket, std::shared_ptr<kv_state> state, kv_state::owner_id id,
                             const server_options& limits, std::function<void()> on_close)
    : socket_(std::move(socket)), state_(std::move(state)), id_(id), max_key_(limits.max_key_size),
      max_value_(limits.max_value_size), max_keys_(limits.max_keys_per_request),
      max_output_(limits.max_buffered_output),
      on_close_(std::move(on_close)),
      // at context shutdown (final): close only, nothing else is safe to touch
      registration_(socket_.get_executor(), [this](bool final) { finish(!final); }) {
  peer_ = net::detail::peer_text(socket_);
  std::error_code ec;
  socket_.set_option(asio::ip::tcp::no_delay(true), ec);
}

torch_session::~torch_session() = default;

void torch_session::start() { asio::co_spawn(socket_.get_executor(), run(), asio::detached); }

void torch_session::close() { finish(true); }

void torch_session::finish(bool notify) {
  if (closed_)
    return;
  closed_ = true;
  std::error_code ignored;
  socket_.close(ignored);
  if (notify && on_close_)
    on_close_(); // drops this session's waits
  on_close_ = nullptr;
}

asio::awaitable<void> torch_session::run() {
  auto self = shared_from_this();
  // Largest query accepted: one maximal value and key with room for framing,
  // and at least 4 maximal values (a MULTI_SET).
  const std::size_t max_query = std::max(max_value_ + 2 * max_key_ + 1024 * 1024, 4 * max_value_);
  std::vector<std::uint8_t> buf(read_chunk);
  std::size_t begin = 0, end = 0;
  while (!closed_) {
    try {
      while (end > begin && !closed_) {
        auto used = serve_one(buf.data() + begin, end - begin);
        if (used == 0)
          break;
        begin += used;
      }
    } catch (const std::exception& e) {
      CORODIST_LOG_WARN("store: closing PyTorch TCPStore client {}: {}", peer_, e.what());
      break;
    }
    flush(); // every response this read produced, in one write
    if (closed_)
      break;
    if (begin == end) {
      begin = end = 0;
      if (buf.size() > read_chunk) // a large query is done: give its memory back
        std::vector<std::uint8_t>(read_chunk).swap(buf);
    } else if (begin > 0) {
      std::memmove(buf.data(), buf.data() + begin, end - begin);
      end -= begin;
      begin = 0;
    }
    if (buf.size() - end < read_chunk / 4) {
      if (buf.size() >= max_query) {
        CORODIST_LOG_WARN("store: closing PyTorch TCPStore client {}: query larger than {} bytes", peer_, max_query);
        break;
      }
      buf.resize(std::min(max_query, buf.size() * 2));
    }
    auto [ec, n] = co_await socket_.async_read_some(asio::buffer(buf.data() + end, buf.size() - end), use_tuple);
    if (ec) {
      if (ec != asio::error::eof && ec != asio::error::operation_aborted && ec != asio::error::connection_reset)
        CORODIST_LOG_DEBUG("store: PyTorch TCPStore client {} read failed: {}", peer_, ec.message());
      break;
    }
    end += n;
  }
  close();
}

std::size_t torch_session::serve_one(const std::uint8_t* data, std::size_t size) {
  using torch::query;
  torch::cursor in(data, size);
  std::uint8_t code = 0;
  if (!in.u8(code))
    return 0;
  if (!version_) {
    // 2.x opens with VALIDATE (0) + magic; 1.13's code 0 is SET, followed by a u64 key length.
    if (code == 0) {
      if (size < 5)
        return 0;
      std::uint32_t magic = 0;
      std::memcpy(&magic, data + 1, 4);
      version_ = magic == torch::validate_magic ? torch::version::v2 : torch::version::v1;
    } else {
      version_ = torch::version::v1;
    }
    CORODIST_LOG_DEBUG("store: {} speaks the PyTorch {} TCPStore protocol", peer_, version_name(*version_));
  }
  auto q = torch::decode_query(*version_, code);
  if (!q)
    throw protocol_error("unknown PyTorch " + std::string(version_name(*version_)) + " TCPStore query code " +
                         std::to_string(code));
  const auto max_key = max_key_;
  const auto max_value = max_value_;
  const auto max_keys = max_keys_;
  // Responses are encoded straight into the output queue, and only once the
  // whole query has been parsed (an incomplete one leaves nothing behind).
  const auto queued_before = out_.size();
  torch::encoder reply(out_);
  switch (*q) {
  case query::validate: {
    std::uint32_t magic = 0;
    if (!in.u32(magic))
      return 0;
    if (magic != torch::validate_magic)
      throw protocol_error("bad VALIDATE magic");
    break;
  }
  case query::ping: {
    std::uint32_t nonce = 0;
    if (!in.u32(nonce))
      return 0;
    reply.u32(nonce);
    break;
  }
  case query::set:
  case query::append: {
    std::string key, value;
    if (!in.bytes(key, max_key, "key") || !in.bytes(value, max_value, "value"))
      return 0;
    if (*q == query::set) {
      state_->set(key, std::move(value));
    } else {
      auto* cur = state_->find(key);
      if ((cur ? cur->size() : 0) + value.size() > max_value)
        throw protocol_error("append would make the value of '" + key + "' exceed max_value_size");
      state_->append(key, value);
    }
    break; // no response
  }
  case query::compare_set: {
    std::string key, expected, desired;
    if (!in.bytes(key, max_key, "key") || !in.bytes(expected, max_value, "value") ||
        !in.bytes(desired, max_value, "value"))
      return 0;
    reply.bytes(state_->compare_set(key, expected, std::move(desired)));
    break;
  }
  case query::get: {
    std::string key;
    if (!in.bytes(key, max_key, "key"))
      return 0;
    auto* v = state_->find(key); // the client WAITs first; a key deleted since reads as empty
    reply.bytes(v ? std::string_view(*v) : std::string_view());
    break;
  }
  case query::add: {
    std::string key;
    std::int64_t delta = 0;
    if (!in.bytes(key, max_key, "key") || !in.i64(delta))
      return 0;
    reply.i64(state_->add(key, delta)); // a non-integer value throws: the protocol has no error reply
    break;
  }
  case query::check: {
    std::vector<std::string> keys;
    if (!in.keys(keys, max_keys, max_key))
      return 0;
    reply.u8(state_->contains_all(keys) ? torch::check_ready : torch::check_not_ready);
    break;
  }
  case query::wait: {
    std::vector<std::string> keys;
    if (!in.keys(keys, max_keys, max_key))
      return 0;
    // No server deadline, as in PyTorch: the client times out (2.x then sends
    // CANCEL_WAIT); the wait goes when the connection does.
    state_->wait(std::move(keys), std::chrono::milliseconds(0), id_,
                 [w = weak_from_this()](std::vector<std::string>&&, std::vector<std::string>&& missing) {
                   auto self = w.lock();
                   if (!self || self->closed_ || !missing.empty())
                     return;
                   const char stop = static_cast<char>(torch::wait_stop_waiting);
                   self->queue_output(std::string_view(&stop, 1));
                   self->flush();
                 });
    break; // answered when the keys exist (possibly at once, above)
  }
  case query::num_keys:
    reply.i64(static_cast<std::int64_t>(state_->size()));
    break;
  case query::delete_key: {
    std::string key;
    if (!in.bytes(key, max_key, "key"))
      return 0;
    reply.i64(state_->erase(key) ? 1 : 0);
    break;
  }
  case query::multi_get: {
    std::vector<std::string> keys;
    if (!in.keys(keys, max_keys, max_key))
      return 0;
    for (auto& k : keys) {
      auto* v = state_->find(k);
      reply.bytes(v ? std::string_view(*v) : std::string_view());
    }
    break;
  }
  case query::multi_set: {
    std::uint64_t n = 0;
    if (!in.u64(n))
      return 0;
    if (n > max_keys)
      throw protocol_error(std::to_string(n) + " keys in one query exceed the limit of " + std::to_string(max_keys));
    torch::cursor scan = in; // all there? (without copying: see cursor::keys)
    for (std::uint64_t i = 0; i < n; ++i)
      if (!scan.skip(max_key, "key") || !scan.skip(max_value, "value"))
        return 0;
    std::vector<std::pair<std::string, std::string>> kvs(n);
    for (auto& [k, v] : kvs)
      if (!in.bytes(k, max_key, "key") || !in.bytes(v, max_value, "value"))
        return 0;
    for (auto& [k, v] : kvs)
      state_->set(k, std::move(v));
    break; // no response
  }
  case query::cancel_wait:
    state_->drop_owner(id_); // this session's pending waits (it has no watches)
    reply.u8(torch::wait_canceled);
    break;
  case query::queue_push: {
    std::string key, value;
    if (!in.bytes(key, max_key, "key") || !in.bytes(value, max_value, "value"))
      return 0;
    state_->queue_push(key, std::move(value));
    break; // no response
  }
  case query::queue_pop: {
    std::string key;
    if (!in.bytes(key, max_key, "key"))
      return 0;
    std::size_t size = 0;
    auto v = state_->queue_pop(key, size);
    reply.i64(static_cast<std::int64_t>(size)); // the length before the pop, then the value if there was one
    if (v)
      reply.bytes(*v);
    break;
  }
  case query::queue_len: {
    std::string key;
    if (!in.bytes(key, max_key, "key"))
      return 0;
    reply.i64(static_cast<std::int64_t>(state_->queue_len(key)));
    break;
  }
  case query::watch_key: // 1.13's callback registration; no Python API uses it
    throw protocol_error("PyTorch 1.13 TCPStore query WATCH_KEY is not supported");
  }
  // (A WAIT answered at once has flushed out_ already: then nothing was added here.)
  if (out_.size() > queued_before)
    check_output(out_.size() - queued_before);
  return in.consumed();
}

void torch_session::queue_output(std::string_view bytes) {
  if (closed_)
    return;
  out_ += bytes;
  check_output(bytes.size());
}

void torch_session::check_output(std::size_t added) {
  const auto queued = out_.size() + sending_.size();
  if (queued > max_output_ && queued > added) {
    CORODIST_LOG_WARN("store: dropping PyTorch TCPStore client {}: it does not read its responses ({} bytes queued)",
                      peer_, queued);
    close();
  }
}

void torch_session::flush() {
  if (writing_ || out_.empty() || closed_)
    return;
  writing_ = true;
  sending_.swap(out_);
  out_.clear();
  asio::async_write(socket_, asio::buffer(sending_), [self = shared_from_this()](std::error_code ec, std::size_t) {
    self->writing_ = false;
    self->sending_.clear();
    if (ec) {
      self->close();
      return;
    }
    self->flush();
  });
}

} // namespace corodist::store::detail
