#pragma once
// A Gloo TCP device whose contexts can fail every unbound buffer they made.
//
// Gloo (commit 5b14351, the one Debian's libgloo-dev packages) signals a
// pair's failure only to the buffers still listed on that pair: a send already
// queued for the socket and a receive already being read are not, so their
// waitSend()/waitRecv() sleeps until the call's own timeout although the
// connection is gone. A gloo_group's abort therefore fails the buffers
// themselves.

#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <memory>
#include <string>

namespace corodist::collective::detail {

struct buffer_registry;

class abortable_device : public gloo::transport::tcp::Device {
public:
  /// A device for `attr` (resolved as gloo::transport::tcp::CreateDevice does).
  static std::shared_ptr<abortable_device> create(const gloo::transport::tcp::attr& attr);

  explicit abortable_device(const gloo::transport::tcp::attr& resolved);
  ~abortable_device() override;

  /// A context whose unbound buffers this device can fail.
  std::shared_ptr<gloo::transport::Context> createContext(int rank, int size) override;

  /// Fails every unbound buffer of this device's contexts, those alive and
  /// those made later: their waits throw gloo::IoException(`why`) at once.
  /// Thread-safe; idempotent (the first reason stays).
  void fail_buffers(const std::string& why);

private:
  std::shared_ptr<buffer_registry> registry_;
};

/// True when `b` (an unbound buffer of an abortable_device's context) has a
/// send completed and not yet waited for, and has not failed: its waitSend()
/// would return at once. Gloo counts a send complete once its data is written
/// to the socket, which a small send does within its send() call. Never blocks.
bool send_completed(gloo::transport::UnboundBuffer& b);

} // namespace corodist::collective::detail
