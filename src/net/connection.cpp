#include <corodist/net/connection.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"
#include "net/auth.hpp"
#include "net/buffer_cache.hpp"
#include "net/endpoint_text.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <cerrno>
#include <cstring>
#include <sys/socket.h>
#include <limits>
#include <tuple>
#include <span>

namespace corodist::net {

namespace {

/// The local end of `s` as text, for the debug lines of connects and accepts.
std::string local_text(const asio::ip::tcp::socket& s) {
  std::error_code ec;
  auto ep = s.local_endpoint(ec);
  return ec ? std::string("?") : detail::endpoint_text(ep);
}

using corodist::detail::use_tuple;
// Size of the per-thread read buffer; a frame that does not fit is read straight
// into its own buffer.
constexpr std::size_t read_buffer_size = 64 * 1024;
// A large frame's body starts with room for this much, and grows x4 as it arrives.
constexpr std::size_t first_large_buffer = 16 * 1024;
// The most one read of a large frame's body takes (between reads, the loop runs others).
constexpr std::size_t large_read_chunk = 4 * 1024 * 1024;
// The most fresh memory a large frame touches per turn of the loop. The first touch of
// a page is what costs (the kernel zeroes it): 0.4 ms per MiB measured on this
// project's VMs, so a 16 MiB growth copy done at once held the loop for 25 ms and
// more. In steps of this size, timers and other connections run in between.
constexpr std::size_t touch_step = 512 * 1024;
// Bodies up to this size are copied next to their header (one iovec per batch);
// larger ones are written in place.
constexpr std::size_t copy_threshold = 2048;
// A turn of the loop that queues this many small frames on a connection sends
// them at once (non-blocking) instead of at the end of the turn, so that the
// peer works on them while this side makes the rest: with many requests in
// flight, waiting for the end of the turn left each side idle while the other
// worked (RPC calls with 64 in flight: 149,000/s -> 265,000/s on this project's
// 2-vCPU VMs; 16 and 64 frames did less well).
constexpr std::size_t eager_send_frames = 32;
// A write buffer larger than this is freed once written, not kept for reuse.
constexpr std::size_t release_above = 1 << 20;
// Largest hello extension accepted (reserved for authentication).
constexpr std::uint32_t max_hello_extension = 64 * 1024;

using clock = std::chrono::steady_clock;

// Completion condition "everything", without the 64 KiB cap per system call
// that Asio's transfer_all() applies (default_max_transfer_size): with it, a
// 64 MiB frame took 1,024 sendmsg and 1,024 recvmsg operations, each a trip
// through the loop.
struct transfer_all_uncapped {
  std::size_t operator()(const std::error_code& ec, std::size_t) const noexcept {
    return ec ? 0 : std::numeric_limits<std::uint32_t>::max();
  }
};

// Reads the peer's hello and validates it; `extension` receives its extension block.
asio::awaitable<std::error_code> read_hello(asio::ip::tcp::socket& s, hello& out, bytes& extension) {
  std::array<std::byte, hello_size> buf;
  auto [ec, n] = co_await asio::async_read(s, asio::buffer(buf), use_tuple);
  if (ec)
    co_return ec == asio::error::eof ? std::error_code(errc::bad_hello) : ec;
  out = decode_hello(buf.data());
  if (out.magic != protocol_magic)
    co_return errc::bad_magic;
  if (out.extension_len > max_hello_extension)
    co_return errc::bad_hello;
  extension.resize(out.extension_len);
  if (out.extension_len) {
    auto [ec2, n2] = co_await asio::async_read(s, asio::buffer(extension), use_tuple);
    if (ec2)
      co_return ec2;
  }
  co_return std::error_code{};
}

asio::awaitable<std::error_code> write_all(asio::ip::tcp::socket& s, asio::const_buffer b) {
  auto [ec, n] = co_await asio::async_write(s, b, use_tuple);
  co_return ec;
}

// The client side of the hello. With a token it sends a nonce, requires the
// server to prove the token over both nonces before proving it in turn, and
// refuses a server that does not authenticate (auth_not_offered).
asio::awaitable<std::error_code> client_handshake(asio::ip::tcp::socket& s, const asio::ip::tcp::endpoint& ep,
                                                  const std::string& token) {
  auto [ec] = co_await s.async_connect(ep, use_tuple);
  if (ec)
    co_return ec;
  s.set_option(asio::ip::tcp::no_delay(true), ec);
  hello mine;
  bytes client_nonce;
  if (!token.empty()) {
    mine.flags |= hello_flags::auth;
    client_nonce = auth_nonce();
    mine.extension_len = static_cast<std::uint32_t>(client_nonce.size());
  }
  auto hb = encode(mine);
  std::array<asio::const_buffer, 2> out{asio::buffer(hb), asio::buffer(client_nonce)};
  if (auto [wec, wn] = co_await asio::async_write(s, out, use_tuple); wec)
    co_return wec;
  hello h;
  bytes ext;
  if (auto rec = co_await read_hello(s, h, ext))
    co_return rec;
  if (h.version != protocol_version)
    co_return errc::unsupported_version;
  const bool server_authenticates = (h.flags & hello_flags::auth) != 0;
  if (token.empty())
    co_return server_authenticates ? std::error_code(errc::auth_required) : std::error_code{};
  if (!server_authenticates)
    co_return errc::auth_not_offered;
  if (ext.size() != auth_nonce_size + auth_proof_size)
    co_return errc::bad_hello;
  const bytes server_nonce(ext.begin(), ext.begin() + auth_nonce_size);
  auth_proof server_proof;
  std::memcpy(server_proof.data(), ext.data() + auth_nonce_size, auth_proof_size);
  if (!check_auth_proof(token, auth_role::server, client_nonce, server_nonce, server_proof))
    co_return errc::auth_failed; // the server does not hold our token
  const auto proof = make_auth_proof(token, auth_role::client, client_nonce, server_nonce);
  if (auto wec = co_await write_all(s, asio::buffer(proof)))
    co_return wec;
  std::array<std::byte, 1> verdict{};
  auto [vec, vn] = co_await asio::async_read(s, asio::buffer(verdict), use_tuple);
  if (vec || verdict[0] != std::byte{1})
    co_return errc::auth_failed;
  co_return std::error_code{};
}

// The server side: with a token, answers the client's nonce with its own and
// its proof, then checks the client's proof.
asio::awaitable<std::error_code> server_handshake(asio::ip::tcp::socket& s, const std::string& token) {
  hello h;
  bytes client_nonce;
  if (auto ec = co_await read_hello(s, h, client_nonce))
    co_return ec;
  // Answer even on a version mismatch so the client can report which we speak.
  hello mine;
  bytes ext;
  const bool client_proves = (h.flags & hello_flags::auth) && client_nonce.size() == auth_nonce_size;
  if (!token.empty() && h.version == protocol_version) {
    mine.flags |= hello_flags::auth;
    ext = auth_nonce();
    if (client_proves) {
      const auto proof = make_auth_proof(token, auth_role::server, client_nonce, ext);
      ext.insert(ext.end(), proof.begin(), proof.end());
    }
    mine.extension_len = static_cast<std::uint32_t>(ext.size());
  }
  auto hb = encode(mine);
  std::array<asio::const_buffer, 2> out{asio::buffer(hb), asio::buffer(ext)};
  auto [wec, wn] = co_await asio::async_write(s, out, use_tuple);
  if (wec)
    co_return wec;
  if (h.version != protocol_version)
    co_return errc::unsupported_version;
  if (token.empty())
    co_return std::error_code{};
  if (!client_proves)
    co_return errc::auth_failed; // a client without a token (it reports auth_required itself)
  const bytes server_nonce(ext.begin(), ext.begin() + auth_nonce_size);
  auth_proof proof;
  auto [rec, rn] = co_await asio::async_read(s, asio::buffer(proof), use_tuple);
  if (rec || !check_auth_proof(token, auth_role::client, client_nonce, server_nonce, proof))
    co_return errc::auth_failed;
  std::array<std::byte, 1> ok{std::byte{1}};
  co_return co_await write_all(s, asio::buffer(ok));
}

// Runs `op` (a hello exchange), giving up with hello_timeout after `timeout` (the op is cancelled).
asio::awaitable<std::error_code> within_handshake_deadline(asio::awaitable<std::error_code> op,
                                               std::chrono::milliseconds timeout) {
  auto r = co_await corodist::detail::within(std::move(op), timeout);
  co_return r ? *r : make_error_code(errc::hello_timeout);
}

} // namespace

void connection::batch::clear() noexcept {
  if (stage.capacity() > release_above)
    bytes().swap(stage); // a burst is over: give its memory back
  else
    stage.clear();
  large.clear();
}

asio::awaitable<std::pair<std::error_code, std::shared_ptr<connection>>>
connection::connect(asio::any_io_executor ex, asio::ip::tcp::endpoint ep, connection_options opts) {
  asio::ip::tcp::socket s(ex);
  auto ec = co_await within_handshake_deadline(client_handshake(s, ep, opts.auth_token), opts.handshake_timeout);
  if (ec) {
    std::error_code ignored;
    s.close(ignored);
    co_return std::pair{ec, std::shared_ptr<connection>{}};
  }
  CORODIST_LOG_DEBUG("net: connected to {} (from {})", detail::endpoint_text(ep), local_text(s));
  co_return std::pair{std::error_code{}, std::make_shared<connection>(std::move(s), opts)};
}

asio::awaitable<std::pair<std::error_code, std::shared_ptr<connection>>>
connection::accept(asio::ip::tcp::socket s, connection_options opts) {
  std::error_code ec;
  s.set_option(asio::ip::tcp::no_delay(true), ec);
  ec = co_await within_handshake_deadline(server_handshake(s, opts.auth_token), opts.handshake_timeout);
  if (ec) {
    std::error_code ignored;
    s.close(ignored);
    co_return std::pair{ec, std::shared_ptr<connection>{}};
  }
  CORODIST_LOG_DEBUG("net: accepted a connection from {} (on {})", detail::peer_text(s), local_text(s));
  co_return std::pair{std::error_code{}, std::make_shared<connection>(std::move(s), opts)};
}

connection::connection(asio::ip::tcp::socket socket, connection_options opts)
    : socket_(std::move(socket)), opts_(opts), registration_(socket_.get_executor(), [this](bool final) {
        close(errc::connection_closed);
        if (final) { // destroyed while the timer service is alive
          timer_.reset();
          stall_timer_.reset();
        }
      }) {
  std::error_code ec;
  remote_ = socket_.remote_endpoint(ec);
}

// The socket's own destructor closes it (after a context shutdown it is already
// closed, and nothing here touches Asio's services).
connection::~connection() = default;

void connection::start(request_handler on_request, close_handler on_close) {
  if (started_)
    return;
  started_ = true;
  on_request_ = std::move(on_request);
  on_close_ = std::move(on_close);
  asio::co_spawn(socket_.get_executor(), read_loop(), asio::detached);
}

std::error_code connection::enqueue(frame_header h, bytes&& body, std::vector<segment>&& segments) {
  if (!open_)
    return errc::connection_closed;
  std::size_t len = body.size();
  for (auto& s : segments)
    len += s.data.size();
  if (len > opts_.max_frame_size)
    return errc::frame_too_large;
  h.payload_len = static_cast<std::uint32_t>(len);
  CORODIST_LOG_TRACE("net: to {}: kind {}, request {}, flags 0x{:x}, {} bytes", detail::endpoint_text(remote_), h.kind,
                     h.request_id, unsigned(h.flags), len);
  auto hdr = encode(h);
  auto& st = queued_.stage;
  if (segments.empty() && body.size() <= copy_threshold) {
    st.insert(st.end(), hdr.begin(), hdr.end());
    st.insert(st.end(), body.begin(), body.end());
  } else {
    st.insert(st.end(), hdr.begin(), hdr.end());
    queued_.large.push_back(large_frame{st.size(), std::move(body), std::move(segments)});
  }
  queued_bytes_ += header_size + len;
  const std::size_t shared = opts_.shared_output ? opts_.shared_output->add(header_size + len) : 0;
  // A frame alone in the queue is always accepted, whatever its size.
  if (queued_bytes_ > opts_.max_buffered_output && queued_bytes_ > header_size + len) {
    CORODIST_LOG_WARN("closing connection to {}: the peer does not read ({} bytes of output queued, cap {})",
                      detail::peer_text(socket_), queued_bytes_, opts_.max_buffered_output);
    close(errc::output_overflow);
    return errc::output_overflow;
  }
  if (opts_.shared_output && shared > opts_.shared_output->limit() &&
      queued_bytes_ >= opts_.shared_output->limit() / 4 && queued_bytes_ > header_size + len) {
    CORODIST_LOG_WARN("closing connection to {}: the peer does not read ({} bytes of output queued for it; its "
                      "group of connections holds {}, cap {})",
                      detail::peer_text(socket_), queued_bytes_, shared, opts_.shared_output->limit());
    close(errc::output_overflow);
    return errc::output_overflow;
  }
  if (++queued_frames_ >= eager_send_frames && !writing_ && queued_.large.empty())
    send_queued_now();
  schedule_write();
  return {};
}

void connection::send_queued_now() {
  queued_frames_ = 0;
  auto& st = queued_.stage;
  // No write is in flight and every queued frame is in `stage`: a plain
  // non-blocking send keeps the byte order. What the socket does not take now
  // (or an error, which the write then meets and closes on) goes the usual way.
  const auto n = ::send(socket_.native_handle(), st.data(), st.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n <= 0)
    return;
  const auto sent = static_cast<std::size_t>(n);
  if (opts_.shared_output)
    opts_.shared_output->remove(sent);
  queued_bytes_ -= sent;
  st.erase(st.begin(), st.begin() + static_cast<std::ptrdiff_t>(sent));
}

void connection::schedule_write() {
  if (writing_ || write_scheduled_)
    return;
  write_scheduled_ = true;
  // Deferred to the end of this turn of the loop, so that frames queued by
  // other coroutines meanwhile go out in the same gathered write.
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    self->write_scheduled_ = false;
    self->start_write();
  });
}

void connection::start_write() {
  if (writing_ || !open_ || (queued_.stage.empty() && queued_.large.empty()))
    return;
  writing_ = true;
  queued_frames_ = 0;
  std::swap(queued_, writing_batch_);
  if (opts_.shared_output)
    opts_.shared_output->remove(queued_bytes_); // handed to the socket
  queued_bytes_ = 0;
  iov_.clear();
  const auto& b = writing_batch_;
  std::size_t pos = 0;
  for (auto& f : b.large) {
    iov_.push_back(asio::buffer(b.stage.data() + pos, f.stage_offset - pos));
    pos = f.stage_offset;
    if (!f.body.empty())
      iov_.push_back(asio::buffer(f.body));
    for (auto& s : f.segments)
      if (s.data.size())
        iov_.push_back(s.data);
  }
  if (pos < b.stage.size())
    iov_.push_back(asio::buffer(b.stage.data() + pos, b.stage.size() - pos));
  asio::async_write(socket_, std::span<const asio::const_buffer>(iov_), transfer_all_uncapped{},
                    [self = shared_from_this()](std::error_code ec, std::size_t) {
                      self->writing_ = false;
                      self->writing_batch_.clear();
                      if (ec) {
                        if (self->open_)
                          CORODIST_LOG_DEBUG("write to {} failed: {}", detail::peer_text(self->socket_), ec.message());
                        self->close(errc::connection_closed);
                        return;
                      }
                      self->start_write();
                    });
}

asio::awaitable<response> connection::request(std::uint16_t kind, bytes payload, std::vector<segment> segments,
                                              std::optional<std::chrono::milliseconds> timeout) {
  if (!open_)
    co_return response{errc::connection_closed, {}};
  if (pending_.size() >= opts_.max_pending_requests)
    co_return response{errc::too_many_pending, {}};
  const std::uint64_t id = next_id_++;
  if (auto ec = enqueue(frame_header{0, kind, 0, id}, std::move(payload), std::move(segments)))
    co_return response{ec, {}};
  auto to = timeout.value_or(opts_.request_timeout);
  auto deadline = to.count() > 0 ? clock::now() + to : clock::time_point::max();
  co_return co_await asio::async_initiate<decltype(asio::use_awaitable), void(response)>(
      [this, id, deadline](auto handler) {
        auto slot = asio::get_associated_cancellation_slot(handler);
        if (slot.is_connected())
          slot.assign([w = weak_from_this(), id](asio::cancellation_type) {
            if (auto self = w.lock())
              self->complete(id, response{asio::error::operation_aborted, {}});
          });
        pending_.emplace(id, pending_request{[h = std::move(handler), slot](response r) mutable {
                                                auto ex = asio::get_associated_executor(h);
                                                asio::post(ex, [h = std::move(h), slot, r = std::move(r)]() mutable {
                                                  if (slot.is_connected())
                                                    slot.clear();
                                                  std::move(h)(std::move(r));
                                                });
                                              },
                                              deadline});
        if (deadline != clock::time_point::max())
          arm_timer(deadline);
      },
      asio::use_awaitable);
}

std::error_code connection::respond(std::uint64_t request_id, std::uint16_t kind, bytes payload,
                                    std::vector<segment> segments) {
  return enqueue(frame_header{0, kind, frame_flags::response, request_id}, std::move(payload), std::move(segments));
}

std::error_code connection::respond_error(std::uint64_t request_id, std::uint16_t kind, std::string_view text) {
  bytes b(text.size());
  std::memcpy(b.data(), text.data(), text.size());
  return enqueue(frame_header{0, kind, frame_flags::response | frame_flags::error, request_id}, std::move(b), {});
}

std::error_code connection::send(std::uint16_t kind, bytes payload, std::vector<segment> segments) {
  return enqueue(frame_header{0, kind, frame_flags::one_way, 0}, std::move(payload), std::move(segments));
}

void connection::complete(std::uint64_t id, response r) {
  auto it = pending_.find(id);
  if (it == pending_.end())
    return; // already completed (timeout, cancellation) or never ours: a late reply is dropped
  auto done = std::move(it->second.complete);
  pending_.erase(it);
  done(std::move(r));
}

void connection::dispatch(message&& m) {
  CORODIST_LOG_TRACE("net: from {}: kind {}, request {}, flags 0x{:x}, {} bytes", detail::endpoint_text(remote_),
                     m.header.kind, m.header.request_id, unsigned(m.header.flags), m.header.payload_len);
  if (m.header.flags & frame_flags::response) {
    auto ec = (m.header.flags & frame_flags::error) ? std::error_code(errc::remote_failure) : std::error_code{};
    complete(m.header.request_id, response{ec, std::move(m)});
    return;
  }
  if (on_request_) {
    on_request_(shared_from_this(), std::move(m));
  } else if (!(m.header.flags & frame_flags::one_way)) {
    respond_error(m.header.request_id, m.header.kind, "no request handler on this connection");
  }
}

std::size_t connection::parse(const std::byte* data, std::size_t n) {
  std::size_t used = 0;
  while (open_ && n - used >= header_size) {
    auto h = decode_header(data + used);
    if (h.payload_len > opts_.max_frame_size) {
      CORODIST_LOG_WARN("closing connection from {}: frame of {} bytes exceeds max_frame_size {}",
                        detail::peer_text(socket_), h.payload_len, opts_.max_frame_size);
      close(errc::frame_too_large);
      return used;
    }
    if (n - used - header_size < h.payload_len)
      break; // incomplete
    const auto* p = data + used + header_size;
    used += header_size + h.payload_len;
    dispatch(message{h, bytes(p, p + h.payload_len)});
  }
  return used;
}

void connection::on_read_error(std::error_code ec, std::size_t frame_bytes) {
  if (!open_)
    return;
  if (ec == errc::frame_stalled) {
    CORODIST_LOG_INFO("closing connection from {}: no byte of an incomplete frame for {} ms ({} bytes of it received)",
                      detail::peer_text(socket_), opts_.frame_timeout.count(), frame_bytes);
    close(errc::frame_stalled);
    return;
  }
  if (frame_bytes > 0) {
    CORODIST_LOG_WARN("connection from {} closed in the middle of a frame ({} bytes buffered): {}",
                      detail::peer_text(socket_), frame_bytes, ec.message());
    close(errc::truncated_frame);
    return;
  }
  if (ec != asio::error::eof)
    CORODIST_LOG_DEBUG("connection from {} lost: {}", detail::peer_text(socket_), ec.message());
  close(errc::connection_closed);
}

// Completion condition "everything" (uncapped, as transfer_all_uncapped) that
// also records the time of each step of progress for the stall watchdog.
struct transfer_all_noting_progress {
  std::chrono::steady_clock::time_point* progress_at;
  std::size_t seen = 0;
  std::size_t operator()(const std::error_code& ec, std::size_t n) noexcept {
    if (n != seen) {
      seen = n;
      *progress_at = clock::now();
    }
    return ec ? 0 : std::numeric_limits<std::uint32_t>::max();
  }
};

// While an incomplete frame is being read, a watchdog looks once per
// frame_timeout whether any byte arrived since the last progress; if none did it
// cancels the read, which then ends with frame_stalled. One timer wait per
// frame_timeout, not one per read.
void connection::arm_stall_watch() {
  if (opts_.frame_timeout.count() <= 0 || stall_watch_armed_)
    return;
  stall_watch_armed_ = true;
  if (!stall_timer_)
    stall_timer_ = std::make_unique<asio::steady_timer>(socket_.get_executor());
  stall_timer_->expires_at(progress_at_ + opts_.frame_timeout);
  stall_timer_->async_wait([w = weak_from_this()](std::error_code ec) {
    if (ec)
      return;
    if (auto self = w.lock())
      self->on_stall_watch();
  });
}

void connection::on_stall_watch() {
  stall_watch_armed_ = false;
  if (!in_frame_ || !open_)
    return;
  if (clock::now() - progress_at_ >= opts_.frame_timeout) {
    stalled_ = true;
    std::error_code ignored;
    socket_.cancel(ignored);
    return;
  }
  arm_stall_watch(); // from the last progress
}

asio::awaitable<std::pair<std::error_code, std::size_t>> connection::read_frame_bytes(asio::mutable_buffer b,
                                                                                     bool all) {
  in_frame_ = true;
  progress_at_ = clock::now();
  arm_stall_watch();
  std::error_code ec;
  std::size_t n = 0;
  if (all) {
    std::tie(ec, n) = co_await asio::async_read(socket_, b, transfer_all_noting_progress{&progress_at_}, use_tuple);
  } else {
    std::tie(ec, n) = co_await socket_.async_read_some(b, use_tuple);
    progress_at_ = clock::now();
  }
  in_frame_ = false;
  if (stalled_)
    ec = errc::frame_stalled;
  co_return std::pair{ec, n};
}

// The body of a frame too large for the read buffer, whose header (and first
// bytes) are in carry_. Memory follows the data: a cached buffer for the whole
// frame if there is one (the process holds it already), else a buffer that
// starts at 64 KiB and grows fourfold each time it fills, so a peer that
// declares a large frame and sends little of it holds little.
asio::awaitable<void> connection::read_large_frame(frame_header h) {
  // The body's memory follows its bytes: room is reserved in steps (x4 from
  // 16 KiB), and only the chunk about to be read is initialised; each read
  // takes at most large_read_chunk, and fresh memory is touched (copied into or
  // initialised) at most touch_step per turn of the loop, so that one frame does
  // not hold the loop for long.
  const std::size_t len = h.payload_len;
  std::size_t got = carry_.size() - header_size;
  bytes body = detail::take_cached_buffer(len); // sized len, or empty
  if (body.empty()) {
    body.reserve(std::min(len, std::max(first_large_buffer, got)));
    body.assign(carry_.begin() + header_size, carry_.end());
  } else {
    std::memcpy(body.data(), carry_.data() + header_size, got);
  }
  carry_ = bytes();
  // Before touching n more bytes of fresh memory: lets the loop run other handlers
  // once this turn has touched touch_step; false when the connection closed meanwhile.
  std::size_t touched = 0; // this turn
  auto may_touch = [this, &touched](std::size_t n) -> asio::awaitable<bool> {
    if (touched > 0 && touched + n > touch_step) {
      // Twice: what a handler posts runs before the loop next polls for completions
      // (timers, other connections); what that one posts, after them.
      co_await asio::post(socket_.get_executor(), asio::use_awaitable);
      co_await asio::post(socket_.get_executor(), asio::use_awaitable);
      touched = 0;
    }
    touched += n;
    co_return open_;
  };
  while (got < len) {
    if (got == body.capacity()) {
      // The intermediate sizes are neither taken from the cache nor offered to
      // it: the cache is for buffers of the sizes frames really have.
      bytes bigger = detail::take_cached_buffer(len);
      if (bigger.empty()) {
        const std::size_t next = std::min(len, body.capacity() * 4);
        bigger = next == len ? detail::reserved_buffer(len) : bytes();
        if (next != len)
          bigger.reserve(next);
        for (std::size_t from = 0; from < got;) {
          const std::size_t n = std::min(touch_step, got - from);
          if (!co_await may_touch(n))
            co_return;
          bigger.insert(bigger.end(), body.begin() + static_cast<std::ptrdiff_t>(from),
                        body.begin() + static_cast<std::ptrdiff_t>(from + n));
          from += n;
        }
      } else {
        std::memcpy(bigger.data(), body.data(), got); // a recycled buffer: its pages are mapped
      }
      body = std::move(bigger);
    }
    const std::size_t chunk = std::min({len - got, large_read_chunk, body.capacity() - got});
    while (body.size() < got + chunk) {
      const std::size_t n = std::min(got + chunk - body.size(), touch_step);
      if (!co_await may_touch(n))
        co_return;
      body.resize(body.size() + n);
    }
    auto [ec, n] = co_await read_frame_bytes(asio::buffer(body.data() + got, chunk), true);
    touched = 0; // the read was a turn of its own
    if (ec) {
      on_read_error(ec, header_size + got);
      co_return;
    }
    got += n;
  }
  body.resize(len);
  dispatch(message{h, std::move(body)});
}

// Idle connections hold only a 512-byte read buffer (head_): a read into it
// stays posted; what follows is drained into a per-thread scratch buffer, and
// frames are parsed straight from there.
// Only the bytes of an incomplete frame are kept, in carry_; a frame too large
// for the scratch buffer is read directly into its own payload buffer.
asio::awaitable<void> connection::read_loop() {
  auto self = shared_from_this();
  thread_local bytes scratch(read_buffer_size);
  // The fd stays in blocking mode: with it, Asio's io_uring backend hands whole
  // recvmsg/sendmsg operations to the kernel; a readiness wait + non-blocking
  // recv instead was measured 2x slower for 1 MiB frames. The drain uses MSG_DONTWAIT.
  try {
    while (open_) {
      if (carry_.empty()) {
        // Keep a read posted so the kernel completes it the moment data arrives:
        // into the 512-byte head_ while traffic is light, into a 64 KiB buffer of
        // the connection's own while reads keep filling the small one.
        const bool big = !big_.empty();
        auto [rec, got] = co_await socket_.async_read_some(big ? asio::buffer(big_) : asio::buffer(head_), use_tuple);
        if (rec) {
          on_read_error(rec, 0);
          co_return;
        }
        if (!open_)
          co_return; // closed meanwhile (a loop draining at its destruction): touch no buffer
        std::byte* data = big_.data();
        std::size_t n = got;
        if (!big) {
          data = scratch.data();
          std::memcpy(data, head_.data(), got);
          if (got == head_.size()) { // more is probably waiting: drain it without waiting
            const ssize_t more = ::recv(socket_.native_handle(), data + n, scratch.size() - n, MSG_DONTWAIT);
            if (more > 0)
              n += static_cast<std::size_t>(more); // errors and EOF surface on the next read
            big_.resize(read_buffer_size);
          }
        } else if (got <= head_.size()) {
          scratch_hold_.swap(big_); // light traffic again: release the big buffer once parsed
        }
        std::size_t used = parse(data, n);
        if (open_ && used < n)
          carry_.assign(data + used, data + n);
        scratch_hold_ = bytes();
        continue;
      }
      // An incomplete frame is buffered: complete it.
      std::size_t want = read_buffer_size;
      if (carry_.size() >= header_size) {
        auto h = decode_header(carry_.data());
        if (header_size + h.payload_len > read_buffer_size) {
          co_await read_large_frame(h);
          continue;
        }
        want = header_size + h.payload_len; // no more than this frame needs
      }
      const std::size_t have = carry_.size();
      carry_.resize(want);
      auto [rec, n] = co_await read_frame_bytes(asio::buffer(carry_.data() + have, want - have), false);
      carry_.resize(have + (rec ? 0 : n));
      if (rec) {
        on_read_error(rec, carry_.size());
        co_return;
      }
      std::size_t used = parse(carry_.data(), carry_.size());
      if (!open_)
        co_return;
      if (used == carry_.size())
        carry_ = bytes(); // release: idle connections keep no buffer
      else if (used > 0)
        carry_.erase(carry_.begin(), carry_.begin() + static_cast<std::ptrdiff_t>(used));
    }
  } catch (const std::exception& e) {
    CORODIST_LOG_ERROR("connection from {}: read loop failed: {}", detail::peer_text(socket_), e.what());
    close(errc::connection_closed);
  }
}

void connection::arm_timer(clock::time_point deadline) {
  if (timer_deadline_ && *timer_deadline_ <= deadline)
    return;
  timer_deadline_ = deadline;
  if (!timer_)
    timer_ = std::make_unique<asio::steady_timer>(socket_.get_executor());
  timer_->expires_at(deadline);
  timer_->async_wait([w = weak_from_this()](std::error_code ec) {
    if (ec)
      return;
    if (auto self = w.lock())
      self->on_timer();
  });
}

void connection::on_timer() {
  timer_deadline_.reset();
  const auto now = clock::now();
  std::vector<std::uint64_t> expired;
  auto next = clock::time_point::max();
  for (auto& [id, p] : pending_) {
    if (p.deadline <= now)
      expired.push_back(id);
    else if (p.deadline < next)
      next = p.deadline;
  }
  for (auto id : expired)
    complete(id, response{errc::request_timeout, {}});
  if (next != clock::time_point::max())
    arm_timer(next);
}

void connection::close(std::error_code reason) {
  if (!open_)
    return;
  open_ = false;
  CORODIST_LOG_DEBUG("net: connection with {} closed: {}", detail::endpoint_text(remote_), reason.message());
  std::error_code ignored;
  socket_.shutdown(asio::socket_base::shutdown_both, ignored);
  socket_.close(ignored);
  if (timer_)
    timer_->cancel();
  if (stall_timer_)
    stall_timer_->cancel();
  timer_deadline_.reset();
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [id, p] : pending)
    p.complete(response{errc::connection_closed, {}});
  queued_.clear();
  if (opts_.shared_output)
    opts_.shared_output->remove(queued_bytes_);
  queued_bytes_ = 0;
  if (on_close_) {
    auto h = std::move(on_close_);
    on_close_ = {};
    h(reason);
  }
  on_request_ = {};
}

} // namespace corodist::net
