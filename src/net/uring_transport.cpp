// The liburing transport of a connection (connection_options::io =
// transport::uring): at start() the socket moves into the loop's
// uring_service, and the reads, writes, cancels and the close of
// reader.cpp, writer.cpp, stall_watch.cpp and connection.cpp go through it.
#include <corodist/net/connection.hpp>

#include "core/log.hpp"
#include "net/connection_io.hpp"
#include "net/endpoint_text.hpp"

#if CORODIST_IO_URING
#include "net/uring_service.hpp"

#include <asio/io_context.hpp>
#endif

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace corodist::net {

transport configured_transport() noexcept {
  const char* env = std::getenv("CORODIST_NET_TRANSPORT");
  if (!env || !*env || std::string_view(env) == "asio")
    return transport::asio;
  if (std::string_view(env) == "uring")
    return transport::uring;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    try {
      CORODIST_LOG_WARN("CORODIST_NET_TRANSPORT='{}' is neither 'asio' nor 'uring': using asio", env);
    } catch (...) {
    }
  }
  return transport::asio;
}

namespace {

// Says once per process why connections stay on Asio.
void stay_on_asio(const std::string& why) {
  static std::atomic<bool> told{false};
  if (!told.exchange(true))
    CORODIST_LOG_WARN("net: the uring transport cannot be used ({}): connections stay on Asio's sockets", why);
}

} // namespace

#if CORODIST_IO_URING

std::string uring_unavailable_reason() {
  static const std::string why = [] {
    std::string w;
    return detail::uring_service::available(&w) ? std::string() : (w.empty() ? std::string("unknown") : w);
  }();
  return why;
}

void connection::adopt_into_uring() {
  if (const auto why = uring_unavailable_reason(); !why.empty()) {
    stay_on_asio(why);
    return;
  }
  const auto executor = socket_.get_executor(); // (target() points into it)
  const auto* ex = executor.target<asio::io_context::executor_type>();
  if (ex == nullptr) {
    stay_on_asio("the connection's executor is not an io_context's own");
    return;
  }
  auto& svc = asio::use_service<detail::uring_service>(ex->context());
  std::error_code ec;
  const int fd = socket_.release(ec);
  if (ec) {
    stay_on_asio("releasing the socket from Asio: " + ec.message());
    return;
  }
  const auto f = svc.adopt(fd, ec);
  if (ec) { // fd is still open: back to Asio, which owns it again
    std::error_code ignored;
    socket_.assign(remote_.protocol(), fd, ignored);
    stay_on_asio("adopting the socket: " + ec.message());
    return;
  }
  uring_ = &svc;
  io_->ring = f.ring;
  io_->slot = f.slot;
}

void connection::cancel_on_uring() noexcept { uring_->cancel(detail::uring_file{io_->ring, io_->slot}); }

void connection::close_on_uring() noexcept {
  uring_->close(detail::uring_file{io_->ring, io_->slot});
  uring_ = nullptr;
  io_->ring = io_->slot = ~std::uint32_t{0};
}

void connection::uring_write() {
  std::size_t first = 0;
  while (first < iov_.size() && iov_[first].size() == 0)
    ++first;
  iov_.erase(iov_.begin(), iov_.begin() + static_cast<std::ptrdiff_t>(first));
  if (iov_.empty() || !open_) {
    write_done(open_ ? std::error_code() : make_error_code(asio::error::operation_aborted));
    return;
  }
  // A send of more than IOV_MAX buffers takes the first IOV_MAX: what is left
  // goes again, as after a short count.
  uring_->async_send_all(detail::uring_file{io_->ring, io_->slot}, std::span<const asio::const_buffer>(iov_),
                         [self = shared_from_this()](std::error_code ec, std::size_t n) {
                           if (ec) {
                             self->write_done(ec);
                             return;
                           }
                           auto& v = self->iov_;
                           std::size_t i = 0;
                           while (i < v.size() && n >= v[i].size())
                             n -= v[i++].size();
                           v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i));
                           if (!v.empty())
                             v.front() += n;
                           self->uring_write();
                         });
}

#else

std::string uring_unavailable_reason() { return "this corodist was built on epoll (-Dio_uring=disabled)"; }

void connection::cancel_on_uring() noexcept {}
void connection::close_on_uring() noexcept {}

void connection::adopt_into_uring() { stay_on_asio(uring_unavailable_reason()); }

void connection::uring_write() { // never reached: uring_ stays null
  write_done(make_error_code(asio::error::operation_not_supported));
}

#endif

} // namespace corodist::net
