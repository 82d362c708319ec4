// Internal. A TCP socket owned by one object (RAII), with the blocking helpers the transport needs.
// Thread-compatible: one reader and one writer may use it at the same time (the kernel allows that);
// callers serialise writers themselves.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "p3/status.h"

namespace p3 {

// The TCP_MAXSEG that data sockets with `buffer_bytes` send/receive buffers get: a quarter of the buffer, so that a
// window always holds several segments; 0 where the kernel's MSS is kept (no buffer set, or one large enough).
int MaxSegmentFor(int buffer_bytes);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // Listens on host:port (port 0 picks a free port; see LocalPort). `buffer_bytes` > 0 sets the
  // receive/send buffers, and the segment size (MaxSegmentFor), that accepted sockets inherit.
  static Status Listen(const std::string& host, uint16_t port, int buffer_bytes, Socket* out);
  // Connects, retrying refused connections until `timeout_s` has passed (peers may start later). The whole
  // call is bounded by timeout_s, also when the peer's listen backlog is full (SYNs unanswered).
  static Status Connect(const std::string& host, uint16_t port, int buffer_bytes, double timeout_s,
                        Socket* out);
  // Waits up to timeout_s for a connection; returns Timeout if none came.
  Status Accept(double timeout_s, Socket* out, std::string* peer) const;
  // Listener in non-blocking mode: one pending connection, or Timeout at once if there is none. The accepted
  // socket itself is blocking.
  Status AcceptNow(Socket* out, std::string* peer) const;
  void SetNonBlocking(bool on) const;

  Status SendAll(const void* data, size_t len) const;
  // Writes all bytes of all iovecs (a header and its payload go out in one call).
  Status SendVec(struct iovec* iov, int iovcnt) const;
  // One write of what the send buffer takes now, never blocking (MSG_DONTWAIT: the descriptor itself stays
  // blocking for the reader thread). *written is 0 when the buffer is full.
  Status SendSome(const struct iovec* iov, int iovcnt, size_t* written) const;
  // The SO_SNDTIMEO bound in seconds (0: none).
  double SendTimeout() const;
  // Reads exactly len bytes. PeerLost on an orderly close before the first byte, IoError otherwise.
  Status RecvAll(void* data, size_t len) const;
  // Reads what has arrived, up to len bytes, never blocking: *got is 0 when nothing is there. PeerLost when
  // the peer closed (orderly or reset) with nothing left to read.
  Status RecvSome(void* data, size_t len, size_t* got) const;
  // Waits until readable or timeout; returns true if readable (or closed).
  bool WaitReadable(double timeout_s) const;

  // A blocking receive that sees no byte for this long fails (so a silent peer cannot stall a loop that
  // serves many peers).
  void SetReceiveTimeout(double timeout_s) const;
  // A blocking send that cannot progress for this long fails.
  void SetSendTimeout(double timeout_s) const;
  // Unblocks any thread blocked in Recv/Send on this socket (used to stop receiver threads).
  void Shutdown() const;
  void Close();
  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  uint16_t LocalPort() const;
  // Whether this connected socket's two ends are one address and port. A connect to a loopback port that nobody
  // listens on yet can succeed against itself (TCP's simultaneous open, when the kernel picks that very port as
  // the source): Connect counts that as refused.
  bool ConnectedToItself() const;

 private:
  int fd_ = -1;
};

}  // namespace p3
