#include "socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "p3/log.h"

namespace p3 {
namespace {

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

Status Resolve(const std::string& host, uint16_t port, sockaddr_in* addr) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::Invalid("cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  std::memcpy(addr, res->ai_addr, sizeof(sockaddr_in));
  addr->sin_port = htons(port);
  freeaddrinfo(res);
  return Status::Ok();
}

void SetBuffers(int fd, int bytes) {
  if (bytes <= 0) return;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
  // Segments of at most a quarter of the buffer. Loopback's MSS (~64 KiB) exceeds a small buffer: the sender then
  // waits for a whole segment's window that the receiver never advertises, and moves a window per persist probe
  // (200 ms), or a segment per delayed ACK (40 ms): a worker's link to its own host's server crawled at 150 KB/s
  // for 15 minutes with 32 KiB buffers (MaxSegmentFor). Links with a smaller MSS (Ethernet's 1448) keep theirs.
  const int mss = MaxSegmentFor(bytes);
  if (mss > 0) setsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, sizeof mss);
}

void SetNoDelay(int fd) {
  int one = 1;  // frames are written whole; Nagle would only delay small control frames
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string Endpoint(const std::string& host, uint16_t port) { return host + ":" + std::to_string(port); }

}  // namespace

int MaxSegmentFor(int buffer_bytes) {
  constexpr int kLargestSettable = 32767;  // TCP_MAXSEG refuses more (MAX_TCP_WINDOW)
  constexpr int kSmallest = 536;           // the IPv4 default MSS: never below it
  if (buffer_bytes <= 0 || buffer_bytes / 4 > kLargestSettable) return 0;
  return std::max(buffer_bytes / 4, kSmallest);
}

Socket::~Socket() { Close(); }

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    Close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

Status Socket::Listen(const std::string& host, uint16_t port, int buffer_bytes, Socket* out) {
  sockaddr_in addr{};
  Status st = Resolve(host, port, &addr);
  if (!st.ok()) return st;
  Socket s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return Status::IoError(Errno("socket"));
  int one = 1;  // allows quick restarts; a port held by a live listener still fails with EADDRINUSE
  setsockopt(s.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  SetBuffers(s.fd_, buffer_bytes);
  if (bind(s.fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (errno == EADDRINUSE) {
      return Status::Invalid("port " + std::to_string(port) + " on " + host +
                             " is already in use: stop the process holding it or choose another port");
    }
    if (errno == EADDRNOTAVAIL) {
      return Status::Invalid("address " + host + " is not an address of this machine: set P3_NODE_HOST or "
                             "P3_INTERFACE to a local address");
    }
    return Status::IoError(Errno(("bind " + Endpoint(host, port)).c_str()));
  }
  if (listen(s.fd_, 128) != 0) return Status::IoError(Errno("listen"));
  *out = std::move(s);
  return Status::Ok();
}

Status Socket::Connect(const std::string& host, uint16_t port, int buffer_bytes, double timeout_s,
                       Socket* out) {
  sockaddr_in addr{};
  Status st = Resolve(host, port, &addr);
  if (!st.ok()) return st;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string last_error;
  auto backoff = std::chrono::milliseconds(20);
  while (true) {
    Socket s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) return Status::IoError(Errno("socket"));
    SetBuffers(s.fd_, buffer_bytes);  // before connect, so the window scale fits
    // Non-blocking connect with a deadline: a blocking one may wait minutes on a full listen backlog.
    s.SetNonBlocking(true);
    int rc = connect(s.fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    if (rc != 0 && errno == EINPROGRESS) {
      const auto left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      pollfd p{s.fd_, POLLOUT, 0};
      const int ready = poll(&p, 1, std::max(0, static_cast<int>(left * 1000)));
      int err = ETIMEDOUT;
      socklen_t len = sizeof err;
      if (ready > 0) getsockopt(s.fd_, SOL_SOCKET, SO_ERROR, &err, &len);
      errno = err;
      rc = err == 0 ? 0 : -1;
    }
    if (rc == 0 && s.ConnectedToItself()) {
      // It would hold the port its peer is about to listen on and handshake with its own bytes: closed, the port
      // is free again and a later attempt reaches the peer.
      rc = -1;
      errno = ECONNREFUSED;
    }
    if (rc == 0) {
      s.SetNonBlocking(false);
      SetNoDelay(s.fd_);
      *out = std::move(s);
      return Status::Ok();
    }
    last_error = std::strerror(errno);
    // The peer may simply not be listening yet (nodes start in any order): retry with backoff.
    // The last attempt comes at the deadline, so that the whole timeout is waited (not up to a backoff less).
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    using Duration = std::chrono::steady_clock::duration;
    std::this_thread::sleep_for(std::min<Duration>(backoff, std::chrono::duration_cast<Duration>(deadline - now)));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  return Status::Timeout("cannot connect to " + Endpoint(host, port) + " within " +
                         Seconds(timeout_s) + " s (" + last_error + ")");
}

Status Socket::Accept(double timeout_s, Socket* out, std::string* peer) const {
  if (!WaitReadable(timeout_s)) return Status::Timeout("no connection");
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  const int fd = accept4(fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
  if (fd < 0) return Status::IoError(Errno("accept"));
  SetNoDelay(fd);
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
  if (peer != nullptr) *peer = Endpoint(ip, ntohs(addr.sin_port));
  *out = Socket(fd);
  return Status::Ok();
}

Status Socket::AcceptNow(Socket* out, std::string* peer) const {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  const int fd = accept4(fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
      return Status::Timeout("no connection");
    }
    return Status::IoError(Errno("accept"));
  }
  SetNoDelay(fd);
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
  if (peer != nullptr) *peer = Endpoint(ip, ntohs(addr.sin_port));
  *out = Socket(fd);
  return Status::Ok();
}

void Socket::SetNonBlocking(bool on) const {
  const int flags = fcntl(fd_, F_GETFL, 0);
  if (flags >= 0) fcntl(fd_, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK);
}

Status Socket::SendAll(const void* data, size_t len) const {
  iovec iov{const_cast<void*>(data), len};
  return SendVec(&iov, 1);
}

Status Socket::SendVec(iovec* iov, int iovcnt) const {
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    const ssize_t n = sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET) return Status::PeerLost(Errno("send"));
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Timeout("peer did not read in time");
      return Status::IoError(Errno("send"));
    }
    size_t left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return Status::Ok();
}

Status Socket::SendSome(const iovec* iov, int iovcnt, size_t* written) const {
  *written = 0;
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(iovcnt);
  while (true) {
    const ssize_t n = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      *written = static_cast<size_t>(n);
      return Status::Ok();
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Ok();
    if (errno == EPIPE || errno == ECONNRESET) return Status::PeerLost(Errno("send"));
    return Status::IoError(Errno("send"));
  }
}

Status Socket::RecvAll(void* data, size_t len) const {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < len) {
    const ssize_t n = recv(fd_, p + got, len - got, 0);
    if (n == 0) {
      return got == 0 ? Status::PeerLost("connection closed by peer")
                      : Status::IoError("connection closed in the middle of a frame (truncated)");
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ECONNRESET) return Status::PeerLost(Errno("recv"));
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Timeout("peer sent nothing in time");
      return Status::IoError(Errno("recv"));
    }
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status Socket::RecvSome(void* data, size_t len, size_t* got) const {
  *got = 0;
  while (true) {
    const ssize_t n = recv(fd_, data, len, MSG_DONTWAIT);
    if (n > 0) {
      *got = static_cast<size_t>(n);
      return Status::Ok();
    }
    if (n == 0) return Status::PeerLost("connection closed by peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Ok();
    if (errno == ECONNRESET) return Status::PeerLost(Errno("recv"));
    return Status::IoError(Errno("recv"));
  }
}

bool Socket::WaitReadable(double timeout_s) const {
  pollfd p{fd_, POLLIN, 0};
  const int ms = timeout_s < 0 ? -1 : static_cast<int>(timeout_s * 1000);
  while (true) {
    const int rc = poll(&p, 1, ms);
    if (rc < 0 && errno == EINTR) continue;
    return rc > 0;
  }
}

void Socket::SetReceiveTimeout(double timeout_s) const {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout_s);
  tv.tv_usec = static_cast<suseconds_t>((timeout_s - static_cast<double>(tv.tv_sec)) * 1e6);
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

void Socket::SetSendTimeout(double timeout_s) const {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout_s);
  tv.tv_usec = static_cast<suseconds_t>((timeout_s - static_cast<double>(tv.tv_sec)) * 1e6);
  setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

double Socket::SendTimeout() const {
  timeval tv{};
  socklen_t len = sizeof tv;
  if (fd_ < 0 || getsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, &len) != 0) return 0;
  return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6;
}

void Socket::Shutdown() const {
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

void Socket::Close() {
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
}

bool Socket::ConnectedToItself() const {
  sockaddr_in mine{}, peer{};
  socklen_t mine_len = sizeof mine, peer_len = sizeof peer;
  if (fd_ < 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&mine), &mine_len) != 0 ||
      getpeername(fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
    return false;
  }
  return mine.sin_family == AF_INET && peer.sin_family == AF_INET && mine.sin_port == peer.sin_port &&
         mine.sin_addr.s_addr == peer.sin_addr.s_addr;
}

uint16_t Socket::LocalPort() const {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (fd_ < 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  return ntohs(addr.sin_port);
}

}  // namespace p3
