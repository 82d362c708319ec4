#include "sender.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <queue>
#include <system_error>
#include <utility>

#include "codec.h"
#include "thread_name.h"

namespace p3 {
namespace {

using Clock = std::chrono::steady_clock;

// While another thread writes a frame on a connection (Send, SendLastWords: handshakes, BYE, failure notes,
// all rare and short), the sender cannot be woken when it ends, so it looks again after this long.
constexpr int kClaimRetryMs = 10;

}  // namespace

struct Sender::Destination {
  // "Less urgent than": lower priority, or equal priority and later arrival (a strict weak ordering).
  struct LessUrgent {
    bool operator()(const Entry& a, const Entry& b) const {
      if (a.priority != b.priority) return a.priority < b.priority;
      return a.seq > b.seq;
    }
  };

  std::shared_ptr<Connection> conn;
  // Guarded by Sender::mu_.
  std::priority_queue<Entry, std::vector<Entry>, LessUrgent> queue;
  bool failed = false;
  // Sender thread only.
  std::optional<Entry> frame;  // started: the connection is claimed until it completes or is abandoned
  uint8_t head[kHeaderBytes] = {};
  uint64_t written = 0;        // bytes of the frame (header first) already in the socket
  bool writable = true;        // false from a full buffer until poll() reports POLLOUT
  Clock::time_point blocked_at;  // when `writable` last became false
  bool claim_busy = false;     // another thread is writing a frame here
  bool stalled = false;        // the peer has taken no byte since stalled_since
  Clock::time_point stalled_since;
  double stall_limit_s = 0;    // the connection's send timeout when the stall began (0: none)
  uint64_t pause_changes = 0;  // the connection's PauseChanges() when stalled_since was last set

  bool HasWork() const { return !failed && (frame || !queue.empty()); }
  const Entry& Next() const { return frame ? *frame : queue.top(); }
  // What the destination is scheduled by: its most urgent frame, queued or in progress. A partly written frame
  // must finish before anything else goes on its connection, so it inherits the priority of the most urgent
  // frame waiting behind it (priority inheritance); ranked by its own priority instead, a low frame cut off by a
  // full buffer would let medium frames to every other peer go first while the node's most urgent one waits.
  const Entry& Rank() const {
    if (!frame) return queue.top();
    if (queue.empty() || !LessUrgent()(*frame, queue.top())) return *frame;
    return queue.top();
  }
  Entry TakeNext() {
    // priority_queue::top is const; the entry is popped right after, so moving out of it is safe.
    Entry e = std::move(const_cast<Entry&>(queue.top()));
    queue.pop();
    return e;
  }
};

Sender::Sender(Trace* trace, ErrorHandler on_error) : trace_(trace), on_error_(std::move(on_error)) {
  wakeup_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wakeup_fd_ < 0) throw std::system_error(errno, std::generic_category(), "sender: eventfd");
}

Sender::~Sender() {
  Abort();
  close(wakeup_fd_);
}

void Sender::Start(double priority_hold_s) {
  hold_ = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(0.0, priority_hold_s)));
  thread_ = std::thread([this] {
    NameThisThread("p3-send");
    while (RunOnce()) {
    }
  });
}

bool Sender::Enqueue(OutMessage m) {
  if (!m.conn) return false;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    std::unique_ptr<Destination>& d = destinations_[m.conn.get()];
    if (!d) {
      d = std::make_unique<Destination>();
      d->conn = m.conn;
    }
    if (d->failed) return false;  // its error already went to on_error
    const int32_t priority = m.header.priority;
    d->queue.push(Entry{priority, next_seq_++, std::move(m)});
    ++queued_;
    wake = !signaled_;
    signaled_ = true;
  }
  if (wake) Signal();
  return true;
}

size_t Sender::Queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_;
}

bool Sender::RunOnce() {
  Destination* next = nullptr;
  Destination* urgent = nullptr;  // the most urgent of all (writable or not) whose peer has not paused
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return false;
    bool work = false;
    for (auto& [conn, d] : destinations_) {
      if (!d->HasWork()) continue;
      work = true;
      if (!d->conn->PeerPaused() && (urgent == nullptr || Destination::LessUrgent()(urgent->Rank(), d->Rank()))) {
        urgent = d.get();
      }
      if (!d->writable) continue;
      if (next == nullptr || Destination::LessUrgent()(next->Rank(), d->Rank())) next = d.get();
    }
    if (!work && closed_) return false;  // drained
  }
  held_until_.reset();
  if (next != nullptr && hold_ > Clock::duration::zero() && urgent != nullptr && !urgent->writable &&
      !urgent->claim_busy && Clock::now() < urgent->blocked_at + hold_) {
    // The node's most urgent frame waits for its destination's buffer: what goes to the others now would
    // overtake it on the NIC, and the destinations' progress would drift apart (a server then waits for the
    // last worker's slice while links idle). Wait for it, up to the hold.
    held_until_ = urgent->blocked_at + hold_;
    next = nullptr;
  }
  if (next != nullptr) {
    Write(next);
  } else {
    Wait();
  }
  return true;
}

void Sender::Write(Destination* d) {
  if (!d->frame) {
    if (!d->conn->TryClaimWrites()) {
      d->writable = false;
      d->claim_busy = true;
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      d->frame = d->TakeNext();
      --queued_;
    }
    EncodeHeader(d->frame->m.header, d->head);
    d->written = 0;
    d->conn->NoteWriting(d->frame->m.header);  // a broadcast of this slice waits for its ReleaseWrites
  }
  const OutMessage& m = d->frame->m;
  const void* data = m.owned ? static_cast<const void*>(m.owned->data()) : m.data;
  const uint64_t before = d->written;
  Status st = d->conn->WriteSome(m.header, d->head, data, &d->written);
  if (!st.ok()) {
    Fail(d, st);
    return;
  }
  if (d->written > before) d->stalled = false;
  if (d->written == kHeaderBytes + m.header.payload_bytes) {
    d->conn->ReleaseWrites(false);
    const Header& h = m.header;
    trace_->Record(TraceEvent::kSend, h.key, h.slice, h.priority, h.iteration, m.peer_rank);
    d->frame.reset();
    return;
  }
  if (d->written > before) return;  // the buffer may have room again by the next step
  // Full buffer: wait for POLLOUT. A frame with no byte out yet goes back to the queue, so a more urgent
  // frame for this destination queued meanwhile can still go first, and others may use the connection.
  d->writable = false;
  d->blocked_at = Clock::now();
  if (!d->stalled) {
    d->stalled = true;
    d->stalled_since = Clock::now();
    d->stall_limit_s = d->conn->SendTimeout();
    d->pause_changes = d->conn->PauseChanges();
  }
  if (d->written == 0) {
    d->conn->ReleaseWrites(false);
    std::lock_guard<std::mutex> lock(mu_);
    d->queue.push(std::move(*d->frame));
    ++queued_;
    d->frame.reset();
  }
}

void Sender::Wait() {
  std::vector<pollfd> fds{{wakeup_fd_, POLLIN, 0}};
  std::vector<Destination*> polled;
  std::vector<Destination*> waiting;
  int timeout_ms = -1;
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [conn, d] : destinations_) {
      if (!d->HasWork() || d->writable) continue;
      waiting.push_back(d.get());
      int ms = -1;
      if (d->claim_busy) {
        ms = kClaimRetryMs;
      } else {
        fds.push_back({d->conn->fd(), POLLOUT, 0});
        polled.push_back(d.get());
      }
      if (d->stalled && d->stall_limit_s > 0 && StallCounts(d.get(), now)) {
        const double left = d->stall_limit_s - std::chrono::duration<double>(now - d->stalled_since).count();
        const int stall_ms = static_cast<int>(std::ceil(std::max(0.0, left) * 1000));
        ms = ms < 0 ? stall_ms : std::min(ms, stall_ms);
      }
      if (ms >= 0) timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    }
  }
  if (held_until_) {  // RunOnce held writable destinations back: look again when the hold ends
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*held_until_ - now).count() + 1;
    const int hold_ms = static_cast<int>(std::max<int64_t>(0, left));
    timeout_ms = timeout_ms < 0 ? hold_ms : std::min(timeout_ms, hold_ms);
  }
  int rc;
  do {
    rc = poll(fds.data(), fds.size(), timeout_ms);
  } while (rc < 0 && errno == EINTR);
  if (fds[0].revents != 0) {
    // Consume the wakeup before clearing the flag: an Enqueue between the two is seen by the next step's scan.
    uint64_t count;
    while (read(wakeup_fd_, &count, sizeof count) < 0 && errno == EINTR) {
    }
    std::lock_guard<std::mutex> lock(mu_);
    signaled_ = false;
  }
  for (size_t i = 0; i < polled.size(); ++i) {
    // POLLERR/POLLHUP also wake it: the next write then reports the error.
    if (fds[i + 1].revents != 0) polled[i]->writable = true;
  }
  const auto after = Clock::now();
  for (Destination* d : waiting) {
    if (d->claim_busy) {
      d->claim_busy = false;
      d->writable = true;  // try to claim again
    }
    if (d->writable || !d->stalled || d->stall_limit_s <= 0 || !StallCounts(d, after)) continue;
    const double stalled_s = std::chrono::duration<double>(after - d->stalled_since).count();
    if (stalled_s < d->stall_limit_s) continue;
    Header h;
    {
      std::lock_guard<std::mutex> lock(mu_);
      h = d->Next().m.header;
    }
    Fail(d, d->conn->SendStalled(h, stalled_s));
  }
}

bool Sender::StallCounts(Destination* d, Clock::time_point now) {
  const uint64_t changes = d->conn->PauseChanges();
  if (changes != d->pause_changes) {  // paused or resumed since: the peer was heard from, count from here
    d->pause_changes = changes;
    d->stalled_since = now;
  }
  return !d->conn->PeerPaused();
}

void Sender::Fail(Destination* d, const Status& st) {
  OutMessage failed;
  if (d->frame) {
    failed = std::move(d->frame->m);
    d->conn->ReleaseWrites(/*torn=*/d->written > 0);
    d->frame.reset();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed.conn && !d->queue.empty()) failed = d->TakeNext().m;
    queued_ -= d->queue.size();
    d->queue = {};
    d->failed = true;
  }
  on_error_(failed, st);
}

void Sender::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (signaled_) return;
    signaled_ = true;
  }
  Signal();
}

void Sender::Signal() {
  const uint64_t one = 1;
  while (write(wakeup_fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

void Sender::Drain() { Stop(/*abort=*/false); }

void Sender::Abort() { Stop(/*abort=*/true); }

void Sender::Stop(bool abort) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    aborted_ = aborted_ || abort;
  }
  Signal();
  if (thread_.joinable()) thread_.join();
  // The thread is gone (or never ran): what is left is dropped, and a partly written frame leaves its
  // connection torn.
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [conn, d] : destinations_) {
    if (d->frame) d->conn->ReleaseWrites(/*torn=*/d->written > 0);
  }
  destinations_.clear();
  queued_ = 0;
}

}  // namespace p3
