#include "connection.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <vector>

#include "codec.h"
#include "handshake.h"

namespace p3 {

Connection::Connection(Socket socket, std::string peer, uint64_t max_payload_bytes, Counters* counters,
                       const char* limit_name)
    : socket_(std::move(socket)), peer_(std::move(peer)), max_payload_bytes_(max_payload_bytes),
      limit_name_(limit_name), counters_(counters) {}

Status Connection::Send(const Header& h, const void* payload) {
  uint8_t head[kHeaderBytes];
  EncodeHeader(h, head);
  iovec iov[2] = {{head, kHeaderBytes}, {const_cast<void*>(payload), h.payload_bytes}};
  if (!ClaimWrites(-1)) {
    return FrameError(h, Status::IoError("an earlier frame was cut off or is still being written by this thread"));
  }
  Status st = socket_.SendVec(iov, h.payload_bytes > 0 ? 2 : 1);
  ReleaseWrites(false);
  if (!st.ok()) return FrameError(h, st);
  counters_->CountSent(h.command, kHeaderBytes + h.payload_bytes);
  return st;
}

void Connection::SendLastWords(const Header& h, const void* payload, double timeout_s) {
  if (!ClaimWrites(timeout_s)) return;
  socket_.SetSendTimeout(timeout_s);
  uint8_t head[kHeaderBytes];
  EncodeHeader(h, head);
  iovec iov[2] = {{head, kHeaderBytes}, {const_cast<void*>(payload), h.payload_bytes}};
  const bool sent = socket_.SendVec(iov, h.payload_bytes > 0 ? 2 : 1).ok();
  ReleaseWrites(false);
  if (sent) counters_->CountSent(h.command, kHeaderBytes + h.payload_bytes);
}

void Connection::Linger(double timeout_s) {
  const int fd = socket_.fd();
  if (fd < 0) return;
  shutdown(fd, SHUT_WR);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char scratch[65536];
  while (true) {
    const double left = std::chrono::duration<double>(end - std::chrono::steady_clock::now()).count();
    if (left <= 0 || !socket_.WaitReadable(left)) return;
    const ssize_t n = recv(fd, scratch, sizeof scratch, MSG_DONTWAIT);
    if (n == 0) return;  // the peer closed: nothing unread is left
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return;
  }
}

bool Connection::ClaimWrites(double timeout_s) {
  std::unique_lock<std::mutex> lock(claim_mu_);
  if (torn_ || (claimed_ && claim_owner_ == std::this_thread::get_id())) return false;
  const auto free = [&] { return !claimed_ || torn_; };
  if (timeout_s < 0) {
    claim_cv_.wait(lock, free);
  } else if (!claim_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), free)) {
    return false;
  }
  if (torn_) return false;
  claimed_ = true;
  claim_owner_ = std::this_thread::get_id();
  writing_ = FrameId();
  return true;
}

void Connection::NoteWriting(const Header& h) {
  std::lock_guard<std::mutex> lock(claim_mu_);
  writing_ = FrameId::Of(h);
}

Status Connection::AwaitWritten(const Header& h) {
  std::unique_lock<std::mutex> lock(claim_mu_);
  const auto mine = [&] { return claimed_ && writing_.AnsweredBy(h); };
  ++awaiting_;
  claim_cv_.wait(lock, [&] { return !mine() || !in_call_; });  // a non-blocking call: it returns
  --awaiting_;
  if (!mine()) return Status::Ok();
  return Status::Invalid("a BROADCAST of key " + std::to_string(h.key) + " slice " + std::to_string(h.slice) +
                         " iteration " + std::to_string(h.iteration) +
                         " arrived while this worker was still sending its PUSH of that slice: the server broadcast "
                         "before it had every worker's push (a faulty or foreign server)");
}

bool Connection::EnterWriteCall(const Header& h) {
  std::lock_guard<std::mutex> lock(claim_mu_);
  if (!writing_.Is(h)) return false;
  in_call_ = true;
  return true;
}

void Connection::LeaveWriteCall(bool all_written) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(claim_mu_);
    in_call_ = false;
    if (all_written) writing_ = FrameId();  // the caller's array is read no more: a broadcast into it may land
    wake = awaiting_ > 0;
  }
  if (wake) claim_cv_.notify_all();
}

bool Connection::TryClaimWrites() { return ClaimWrites(0); }

void Connection::ReleaseWrites(bool torn) {
  {
    std::lock_guard<std::mutex> lock(claim_mu_);
    claimed_ = false;
    claim_owner_ = std::thread::id();
    writing_ = FrameId();
    in_call_ = false;
    torn_ = torn_ || torn;
  }
  claim_cv_.notify_all();
}

Status Connection::WriteSome(const Header& h, const uint8_t* head, const void* payload, uint64_t* written) {
  const uint64_t total = kHeaderBytes + h.payload_bytes;
  iovec iov[2];
  int n = 0;
  if (*written < kHeaderBytes) {
    iov[n++] = {const_cast<uint8_t*>(head) + *written, kHeaderBytes - *written};
    if (h.payload_bytes > 0) iov[n++] = {const_cast<void*>(payload), h.payload_bytes};
  } else {
    const uint64_t done = *written - kHeaderBytes;
    iov[n++] = {const_cast<char*>(static_cast<const char*>(payload)) + done, h.payload_bytes - done};
  }
  size_t wrote = 0;
  const bool noted = EnterWriteCall(h);
  Status st = socket_.SendSome(iov, n, &wrote);
  if (st.ok()) *written += wrote;
  if (noted) LeaveWriteCall(st.ok() && *written == total);
  if (!st.ok()) return FrameError(h, st);
  if (*written == total) counters_->CountSent(h.command, total);
  return st;
}

Status Connection::SendStalled(const Header& h, double stalled_s) const {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", stalled_s);
  return FrameError(h, Status::Timeout(std::string("peer did not read in time (took no byte for ") + secs + " s)"));
}

Status Connection::FrameError(const Header& h, const Status& st) const {
  return st.WithContext("sending " + std::string(CommandName(h.command)) + " to " + peer_);
}

Status Connection::Authenticate(const std::string& secret, double timeout_s) const {
  return AuthenticateConnector(socket_, secret, timeout_s);
}

Status Connection::RecvFrameBytes(void* dst, uint64_t len, bool first) {
  if (frame_deadline_s_ <= 0) return socket_.RecvAll(dst, len);
  char* p = static_cast<char*>(dst);
  if (first) {
    // Between frames the peer may be silent for as long as it likes: block for the first byte only.
    Status st = socket_.RecvAll(p, 1);
    if (!st.ok()) return st;
    frame_end_ = std::chrono::steady_clock::now() +
                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                     std::chrono::duration<double>(frame_deadline_s_));
    ++p;
    --len;
  }
  // Reads what the socket holds before polling: mid-frame the bytes are mostly there already (a slice is larger
  // than one read), and a poll() ahead of each recv() would double the system calls per frame. Only a read that
  // finds nothing waits, up to the frame's deadline.
  while (len > 0) {
    size_t got = 0;
    Status st = socket_.RecvSome(p, len, &got);
    if (st.code() == Status::Code::kPeerLost) {
      return Status::IoError("connection closed in the middle of a frame (truncated)");
    }
    if (!st.ok()) return st;
    p += got;
    len -= got;
    if (len == 0) break;
    const double left = std::chrono::duration<double>(frame_end_ - std::chrono::steady_clock::now()).count();
    if (left <= 0 || (got == 0 && !socket_.WaitReadable(left))) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.0f", frame_deadline_s_);
      return Status::Timeout(std::string("a frame was not complete within ") + secs + " s of its first byte");
    }
  }
  return Status::Ok();
}

Status Connection::ReadHeader(Header* h) {
  uint8_t head[kHeaderBytes];
  Status st = RecvFrameBytes(head, kHeaderBytes, /*first=*/true);
  if (!st.ok()) return st;
  st = DecodeHeader(head, max_payload_bytes_, h, limit_name_);
  if (!st.ok()) {
    counters_->rejected_frames.fetch_add(1, std::memory_order_relaxed);
    return st;
  }
  counters_->CountReceived(h->command, kHeaderBytes + h->payload_bytes);
  return st;
}

Status Connection::ReadPayload(void* dst, uint64_t len) { return RecvFrameBytes(dst, len, /*first=*/false); }

Status Connection::ReadPayload(std::string* dst, uint64_t len) {
  // Grows as bytes arrive: a header that claims more than its sender sends costs nothing.
  constexpr uint64_t kChunk = 1 << 16;
  dst->clear();
  while (dst->size() < len) {
    const size_t at = dst->size();
    const uint64_t n = std::min<uint64_t>(len - at, std::max<uint64_t>(kChunk, at));
    dst->resize(at + n);
    Status st = RecvFrameBytes(&(*dst)[at], n, /*first=*/false);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Status Connection::ReadAvailable(PartialFrame* f, bool* complete) {
  *complete = false;
  while (f->head_got < kHeaderBytes) {
    size_t got = 0;
    Status st = socket_.RecvSome(f->head + f->head_got, kHeaderBytes - f->head_got, &got);
    if (st.code() == Status::Code::kPeerLost && f->begun()) {
      return Status::IoError("connection closed in the middle of a frame (truncated)");
    }
    if (!st.ok()) return st;
    if (got == 0) return st;
    if (!f->begun()) f->started = std::chrono::steady_clock::now();
    f->head_got += got;
    if (f->head_got < kHeaderBytes) continue;
    st = DecodeHeader(f->head, max_payload_bytes_, &f->header, limit_name_);
    if (!st.ok()) {
      counters_->rejected_frames.fetch_add(1, std::memory_order_relaxed);
      return st;
    }
  }
  constexpr size_t kChunk = 1 << 16;
  while (f->payload.size() < f->header.payload_bytes) {
    const size_t at = f->payload.size();
    const size_t want = static_cast<size_t>(std::min<uint64_t>(f->header.payload_bytes - at, kChunk));
    f->payload.resize(at + want);
    size_t got = 0;
    Status st = socket_.RecvSome(&f->payload[at], want, &got);
    f->payload.resize(at + got);
    if (st.code() == Status::Code::kPeerLost) {
      return Status::IoError("connection closed in the middle of a frame (truncated)");
    }
    if (!st.ok() || got == 0) return st;
  }
  counters_->CountReceived(f->header.command, kHeaderBytes + f->header.payload_bytes);
  *complete = true;
  return Status::Ok();
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
