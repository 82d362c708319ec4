#include "gatekeeper.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <map>

#include "handshake.h"
#include "p3/log.h"
#include "p3/message.h"
#include "thread_name.h"

namespace p3 {
namespace {
using Clock = std::chrono::steady_clock;
constexpr size_t kAcceptsPerRound = 64;  // then serve the pending handshakes before accepting more

std::string SourceOf(const std::string& peer) { return peer.substr(0, peer.rfind(':')); }

// Sends all of a short message or fails: a fresh connection's send buffer always takes it.
bool SendShort(const Socket& s, const void* data, size_t len) {
  return send(s.fd(), data, len, MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(len);
}
}  // namespace

struct Gatekeeper::Pending {
  Socket socket;
  std::string peer;
  std::string source;
  Clock::time_point accepted;
  AcceptorHandshake handshake;
  bool authenticated = false;  // then reading the first header
  uint8_t buf[kHeaderBytes > kAnswerBytes ? kHeaderBytes : kAnswerBytes] = {};
  size_t got = 0;
};

Gatekeeper::Gatekeeper(Options options, Admit admit, Counters* counters)
    : options_(std::move(options)), admit_(std::move(admit)), counters_(counters), refusal_log_(Clock::now()) {}

Gatekeeper::~Gatekeeper() {
  Stop();
  for (int fd : wake_pipe_) {
    if (fd >= 0) close(fd);
  }
}

Status Gatekeeper::Start(const Socket* listener, std::string who) {
  listener_ = listener;
  who_ = std::move(who);
  listener_->SetNonBlocking(true);
  if (pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) return Status::IoError("pipe2 failed");
  thread_ = std::thread([this] {
    NameThisThread("p3-gatekeeper");
    Loop();
  });
  return Status::Ok();
}

void Gatekeeper::Stop() {
  if (!thread_.joinable()) return;
  const char c = 1;
  if (write(wake_pipe_[1], &c, 1) < 0) {
    // Cannot happen with an empty pipe; the loop would still end at its next wake-up.
  }
  thread_.join();
}

void Gatekeeper::LogRefusal(const std::string& source, const std::string& line) {
  const RefusalLog::Decision d = refusal_log_.Refused(source, Clock::now());
  if (!d.log) return;
  if (d.unlogged > 0) {
    Log(LogLevel::kWarning, who_, "refused " + std::to_string(d.unlogged) + " more connections from " +
        (d.others ? "other addresses" : source) + " that were not logged one by one (a flood?)");
  }
  Log(LogLevel::kWarning, who_, line);
}

void Gatekeeper::Refuse(Pending* p, const std::string& why) {
  refused_.fetch_add(1, std::memory_order_relaxed);
  counters_->rejected_frames.fetch_add(1, std::memory_order_relaxed);
  LogRefusal(p->source, "refused the connection from " + p->peer + ": " + why);
  p->socket.Close();  // at once: a refused connection keeps no descriptor
}

bool Gatekeeper::AcceptNew(std::vector<std::unique_ptr<Pending>>* pending) {
  for (size_t i = 0; i < kAcceptsPerRound; ++i) {
    auto p = std::make_unique<Pending>();
    Status st = listener_->AcceptNow(&p->socket, &p->peer);
    if (st.code() == Status::Code::kTimeout) return true;
    if (!st.ok()) {
      LogRefusal("(accept)", st.message());  // no peer yet: failed accepts share a budget of their own
      return false;
    }
    p->source = SourceOf(p->peer);
    p->accepted = Clock::now();
    if (pending->size() >= options_.max_pending) {
      // Make room: close the oldest pending handshake of the busiest source.
      std::map<std::string, size_t> per_source;
      for (const auto& q : *pending) per_source[q->source] += 1;
      const auto busiest = std::max_element(per_source.begin(), per_source.end(),
                                            [](const auto& a, const auto& b) { return a.second < b.second; });
      for (auto it = pending->begin(); it != pending->end(); ++it) {
        if ((*it)->source != busiest->first) continue;
        Refuse(it->get(), std::to_string(options_.max_pending) + " connections are in the handshake, " +
                              std::to_string(busiest->second) + " of them from " + busiest->first +
                              ": closed the oldest of those");
        pending->erase(it);
        break;
      }
    }
    st = p->handshake.Start();
    if (st.ok() && !SendShort(p->socket, p->handshake.challenge(), kChallengeBytes)) {
      st = Status::PeerLost("connection ended before the challenge could be sent");
    }
    if (!st.ok()) {
      Refuse(p.get(), st.message());
      continue;
    }
    pending->push_back(std::move(p));
    size_t peak = peak_pending_.load(std::memory_order_relaxed);
    if (pending->size() > peak) peak_pending_.store(pending->size(), std::memory_order_relaxed);
  }
  return true;
}

bool Gatekeeper::Step(Pending* p) {
  const size_t need = p->authenticated ? kHeaderBytes : kAnswerBytes;
  size_t got = 0;
  Status st = p->socket.RecvSome(p->buf + p->got, need - p->got, &got);
  if (!st.ok()) {
    if (!p->authenticated) {
      Refuse(p, "connection ended during the handshake (answer to the challenge): " + st.message());
    } else if (p->got == 0 || st.code() != Status::Code::kPeerLost) {
      Refuse(p, st.message() + " before its first frame");
    } else {
      Refuse(p, "connection closed in the middle of a frame (truncated): " + std::to_string(p->got) + " of the " +
                    std::to_string(kHeaderBytes) + " header bytes of its first frame came");
    }
    return true;
  }
  p->got += got;
  if (p->got < need) return false;
  if (!p->authenticated) {
    unsigned char reply[kProofBytes];
    st = p->handshake.Check(options_.secret, p->buf, reply);
    const bool sent = SendShort(p->socket, reply, sizeof reply);
    if (!st.ok()) {
      Refuse(p, st.message());
      return true;
    }
    if (!sent) {
      Refuse(p, "connection ended during the handshake (proof)");
      return true;
    }
    if (options_.first_header) {
      p->authenticated = true;
      p->got = 0;
      return false;
    }
  }
  st = admit_(&p->socket, p->peer, options_.first_header ? p->buf : nullptr);
  if (!st.ok()) Refuse(p, st.message());
  return true;
}

void Gatekeeper::Loop() {
  std::vector<std::unique_ptr<Pending>> pending;
  const auto deadline = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.deadline_s));
  std::vector<pollfd> fds;
  Clock::time_point accept_paused_until;  // after a failed accept (out of descriptors): do not spin on it
  while (true) {
    // Deadlines first: whole handshake, from the accept.
    const auto now = Clock::now();
    Clock::time_point next = now + std::chrono::seconds(1);
    for (auto it = pending.begin(); it != pending.end();) {
      Pending* p = it->get();
      if (now - p->accepted >= deadline) {
        char secs[32];
        std::snprintf(secs, sizeof secs, "%.0f", options_.deadline_s);
        Refuse(p, p->authenticated ? "the first frame (HELLO) was not complete within " + std::string(secs) +
                                         " s of the connection (" + std::to_string(p->got) + " of " +
                                         std::to_string(kHeaderBytes) + " header bytes)"
                                   : "no answer to the challenge in time (" + std::string(secs) +
                                         " s for the whole handshake; " + std::to_string(p->got) + " of " +
                                         std::to_string(kAnswerBytes) + " bytes came)");
        it = pending.erase(it);
      } else {
        next = std::min(next, p->accepted + deadline);
        ++it;
      }
    }
    fds.clear();
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    const bool accepting = now >= accept_paused_until;
    if (!accepting) next = std::min(next, accept_paused_until);
    fds.push_back({accepting ? listener_->fd() : -1, POLLIN, 0});
    for (const auto& p : pending) fds.push_back({p->socket.fd(), POLLIN, 0});
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count() + 1;
    const int rc = poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait, 1)));
    if (rc < 0) continue;  // EINTR
    if (fds[0].revents != 0) break;
    // Pending connections first (indices match `fds` before any accept changes `pending`).
    size_t kept = 0;
    for (size_t i = 0; i < pending.size(); ++i) {
      const bool finished = fds[i + 2].revents != 0 && Step(pending[i].get());
      if (!finished) pending[kept++] = std::move(pending[i]);
    }
    pending.resize(kept);
    if ((fds[1].revents & POLLIN) && !AcceptNew(&pending)) {
      accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
    }
  }
  for (auto& p : pending) p->socket.Close();
}

}  // namespace p3
