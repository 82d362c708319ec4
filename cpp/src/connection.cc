#include "p3/connection.h"

#include <chrono>
#include <vector>

#include "p3/codec.h"
#include "p3/handshake.h"

namespace p3 {

Connection::Connection(Socket socket, std::string peer, uint64_t max_payload_bytes, Counters* counters)
    : socket_(std::move(socket)), peer_(std::move(peer)), max_payload_bytes_(max_payload_bytes),
      counters_(counters) {}

Status Connection::Send(const Header& h, const void* payload) {
  uint8_t head[kHeaderBytes];
  EncodeHeader(h, head);
  iovec iov[2] = {{head, kHeaderBytes}, {const_cast<void*>(payload), h.payload_bytes}};
  Status st;
  {
    std::lock_guard<std::timed_mutex> lock(write_mu_);
    st = socket_.SendVec(iov, h.payload_bytes > 0 ? 2 : 1);
  }
  if (!st.ok()) return st.WithContext("sending " + std::string(CommandName(h.command)) + " to " + peer_);
  counters_->CountSent(h.command, kHeaderBytes + h.payload_bytes);
  return st;
}

void Connection::SendLastWords(const Header& h, const void* payload, double timeout_s) {
  std::unique_lock<std::timed_mutex> lock(write_mu_, std::chrono::duration<double>(timeout_s));
  if (!lock.owns_lock()) return;
  socket_.SetSendTimeout(timeout_s);
  uint8_t head[kHeaderBytes];
  EncodeHeader(h, head);
  iovec iov[2] = {{head, kHeaderBytes}, {const_cast<void*>(payload), h.payload_bytes}};
  if (socket_.SendVec(iov, h.payload_bytes > 0 ? 2 : 1).ok()) {
    counters_->CountSent(h.command, kHeaderBytes + h.payload_bytes);
  }
}

Status Connection::Authenticate(const std::string& secret, double timeout_s) const {
  return AuthenticateConnector(socket_, secret, timeout_s);
}

Status Connection::ReadHeader(Header* h) {
  uint8_t head[kHeaderBytes];
  Status st = socket_.RecvAll(head, kHeaderBytes);
  if (!st.ok()) return st;
  st = DecodeHeader(head, max_payload_bytes_, h);
  if (!st.ok()) {
    counters_->rejected_frames.fetch_add(1, std::memory_order_relaxed);
    return st;
  }
  counters_->CountReceived(h->command, kHeaderBytes + h->payload_bytes);
  return st;
}

Status Connection::ReadPayload(void* dst, uint64_t len) { return socket_.RecvAll(dst, len); }

Status Connection::ReadPayload(std::string* dst, uint64_t len) {
  dst->resize(len);
  return len == 0 ? Status::Ok() : socket_.RecvAll(&(*dst)[0], len);
}

Status Connection::SkipPayload(uint64_t len) {
  std::vector<char> sink(static_cast<size_t>(std::min<uint64_t>(len, 1 << 16)));
  while (len > 0) {
    const uint64_t n = std::min<uint64_t>(len, sink.size());
    Status st = socket_.RecvAll(sink.data(), n);
    if (!st.ok()) return st;
    len -= n;
  }
  return Status::Ok();
}

}  // namespace p3
