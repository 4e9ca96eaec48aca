// A connection's life: construction, start (which posts the first read and
// puts the connection on its loop's heartbeat wheel) and close (which fails
// the pending requests and tells the close handler); the hello, the output,
// the pending requests and the reads are in handshake.cpp, writer.cpp,
// pending_requests.cpp, reader.cpp, stall_watch.cpp, large_frame_reader.cpp
// and heartbeat.cpp (with heartbeat_wheel.hpp).
#include <corodist/net/connection.hpp>

#include "core/log.hpp"
#include "net/connection_counting.hpp"
#include "net/connection_io.hpp"
#include "net/endpoint_text.hpp"
#include "net/tls_stream.hpp"

#include <asio/post.hpp>

#include <atomic>

namespace corodist::net {

connection::connection(asio::ip::tcp::socket socket, connection_options opts)
    : socket_(std::move(socket)), opts_(opts), io_(std::make_unique<io_state>()), registration_(socket_.get_executor(), [this](bool final) {
        close(errc::connection_closed);
        if (final) { // destroyed while the timer service is alive
          timer_.reset();
          stall_timer_.reset();
        }
      }) {
  std::error_code ec;
  remote_ = socket_.remote_endpoint(ec);
  received_at_ = sent_at_ = std::chrono::steady_clock::now();
}

connection::connection(std::unique_ptr<detail::tls_stream> tls, connection_options opts)
    : connection(asio::ip::tcp::socket(tls->stream.get_executor()), std::move(opts)) {
  tls_ = std::move(tls);
  std::error_code ec;
  remote_ = tls_->stream.next_layer().remote_endpoint(ec);
  if (opts_.io == transport::uring) {
    static std::atomic<bool> told{false};
    if (!told.exchange(true))
      CORODIST_LOG_INFO("net: TLS connections run on the asio transport (transport::uring does not carry TLS)");
    opts_.io = transport::asio;
  }
}

asio::ip::tcp::socket& connection::tcp() noexcept { return tls_ ? tls_->stream.next_layer() : socket_; }

int connection::native_handle() noexcept { return uring_ ? -1 : tcp().native_handle(); }

// The socket's own destructor closes it (after a context shutdown it is already
// closed, and nothing here touches Asio's services). A connection leaves its
// heartbeat wheel at close; one never closed leaves it here.
connection::~connection() { stop_heartbeat(); }

void connection::start(request_handler on_request, close_handler on_close) {
  if (started_)
    return;
  started_ = true;
  if (open_)
    detail::bump(detail::counting().opened);
  on_request_ = std::move(on_request);
  on_close_ = std::move(on_close);
  received_at_ = sent_at_ = std::chrono::steady_clock::now();
  if (opts_.io == transport::uring && open_)
    adopt_into_uring();
  post_read();
  start_heartbeat();
}

void connection::close(std::error_code reason) {
  if (!open_)
    return;
  open_ = false;
  if (started_) {
    detail::bump(detail::counting().closed);
    if (reason == errc::peer_timed_out || reason == errc::output_overflow || reason == errc::truncated_frame ||
        reason == errc::frame_stalled || reason == errc::frame_too_large)
      detail::bump(detail::counting().lost);
  }
  auto keep = std::move(parked_hold_); // (a parked connection lives to the end of this)
  CORODIST_LOG_DEBUG("net: connection with {} closed: {}", detail::endpoint_text(remote_), reason.message());
  std::error_code ignored;
  if (uring_ != nullptr) // the kernel closes the socket once the cancelled operations let go of it
    close_on_uring();
  tcp().shutdown(asio::socket_base::shutdown_both, ignored);
  tcp().close(ignored);
  if (timer_)
    timer_->cancel();
  if (stall_timer_)
    stall_timer_->cancel();
  stop_heartbeat();
  timer_deadline_.reset();
  // Pending requests fail after this close is done (its close handler has
  // run), from the loop's queue: not inside whatever closed it.
  if (!pending_.empty()) {
    const std::error_code failed =
        reason == errc::peer_timed_out ? reason : make_error_code(errc::connection_closed);
    asio::post(socket_.get_executor(), [pending = std::move(pending_), failed]() mutable {
      for (auto& [id, p] : pending)
        p.complete(response{failed, {}});
    });
    pending_.clear();
  }
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
  if (on_written_) // its watcher learns that this output will not drain
    asio::post(socket_.get_executor(), std::move(on_written_));
  on_written_ = {};
}

} // namespace corodist::net
