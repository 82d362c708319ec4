#include "handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

namespace p3 {
namespace {

constexpr char kGreeting[8] = {'P', '3', 'K', 'V', 'A', 'U', 'T', 'H'};
constexpr uint8_t kHandshakeVersion = 1;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = kProofBytes;  // SHA-256
static_assert(kChallengeBytes == sizeof kGreeting + 1 + kNonceBytes, "challenge layout");
static_assert(kAnswerBytes == kNonceBytes + kMacBytes, "answer layout");
// One attempt of ConnectAuthenticated may take this long; an acceptor gives a handshake less (gatekeeper.h).
constexpr double kAttemptS = 10.0;

struct Nonce {
  unsigned char bytes[kNonceBytes];
};

void Mac(const std::string& secret, const char* label, const unsigned char* a, const unsigned char* c,
         unsigned char out[kMacBytes]) {
  std::string msg(label);
  msg.append(reinterpret_cast<const char*>(a), kNonceBytes);
  msg.append(reinterpret_cast<const char*>(c), kNonceBytes);
  unsigned int len = kMacBytes;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), out, &len);
}

// A whole-step bound: every read of the handshake shares one deadline (not one timeout per read), restoring
// "no receive timeout" afterwards (data connections block for as long as needed).
class Deadline {
 public:
  Deadline(const Socket& s, double timeout_s)
      : socket_(s),
        end_(std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                    std::chrono::duration<double>(timeout_s))) {}
  ~Deadline() { socket_.SetReceiveTimeout(0); }
  Status RecvAll(void* data, size_t len) const {
    char* p = static_cast<char*>(data);
    while (len > 0) {
      const double left = std::chrono::duration<double>(end_ - std::chrono::steady_clock::now()).count();
      if (left <= 0 || !socket_.WaitReadable(left)) return Status::Timeout("deadline passed");
      size_t got = 0;
      Status st = socket_.RecvSome(p, len, &got);
      if (!st.ok()) return st;
      p += got;
      len -= got;
    }
    return Status::Ok();
  }

 private:
  const Socket& socket_;
  const std::chrono::steady_clock::time_point end_;
};

Status Ended(const Status& st, const char* step) {
  if (st.code() == Status::Code::kTimeout) return Status::Timeout(std::string("no ") + step + " in time");
  return Status::PeerLost(std::string("connection ended during the handshake (") + step + "): " + st.message());
}

bool IsRefusal(const unsigned char proof[kProofBytes]) {
  static const unsigned char kZero[kProofBytes] = {};
  return CRYPTO_memcmp(proof, kZero, kProofBytes) == 0;
}

}  // namespace

Status AcceptorHandshake::Start() {
  std::memcpy(challenge_, kGreeting, sizeof kGreeting);
  challenge_[sizeof kGreeting] = kHandshakeVersion;
  if (RAND_bytes(challenge_ + sizeof kGreeting + 1, kNonceBytes) != 1) {
    return Status::IoError("no randomness for the handshake nonce");
  }
  return Status::Ok();
}

Status AcceptorHandshake::Check(const std::string& secret, const unsigned char answer[kAnswerBytes],
                                unsigned char reply[kProofBytes]) const {
  const unsigned char* a = challenge_ + sizeof kGreeting + 1;
  const unsigned char* c = answer;
  unsigned char expected[kMacBytes];
  Mac(secret, "connector", a, c, expected);
  if (CRYPTO_memcmp(expected, answer + kNonceBytes, kMacBytes) != 0) {
    std::memset(reply, 0, kProofBytes);
    return Status::Rejected("the peer does not know the job's secret (P3_SECRET): wrong secret, another job, or "
                            "not a p3kv node");
  }
  Mac(secret, "acceptor", a, c, reply);
  if (IsRefusal(reply)) return Status::Rejected("the proof is indistinguishable from a refusal (p = 2^-256)");
  return Status::Ok();
}

Status AuthenticateConnector(const Socket& socket, const std::string& secret, double timeout_s) {
  Deadline deadline(socket, timeout_s);
  AcceptorHandshake hs;
  Status st = hs.Start();
  if (!st.ok()) return st;
  st = socket.SendAll(hs.challenge(), kChallengeBytes);
  if (!st.ok()) return Ended(st, "challenge");
  unsigned char answer[kAnswerBytes];
  st = deadline.RecvAll(answer, sizeof answer);
  if (!st.ok()) return Ended(st, "answer to the challenge");
  unsigned char reply[kProofBytes];
  const Status checked = hs.Check(secret, answer, reply);
  st = socket.SendAll(reply, sizeof reply);
  if (!checked.ok()) return checked;
  return st.ok() ? st : Ended(st, "proof");
}

Status AuthenticateToAcceptor(const Socket& socket, const std::string& secret, double timeout_s) {
  Deadline deadline(socket, timeout_s);
  unsigned char hello[kChallengeBytes];
  Status st = deadline.RecvAll(hello, sizeof hello);
  if (!st.ok()) return Ended(st, "challenge");
  if (std::memcmp(hello, kGreeting, sizeof kGreeting) != 0) {
    return Status::Invalid("the peer is not a p3kv node (no authentication challenge)");
  }
  if (hello[sizeof kGreeting] != kHandshakeVersion) {
    return Status::Invalid("the peer speaks handshake version " + std::to_string(hello[sizeof kGreeting]) +
                           ", expected " + std::to_string(kHandshakeVersion) + " (mixed p3kv versions?)");
  }
  const unsigned char* a = hello + sizeof kGreeting + 1;
  Nonce c;
  if (RAND_bytes(c.bytes, kNonceBytes) != 1) return Status::IoError("no randomness for the handshake nonce");
  unsigned char answer[kAnswerBytes];
  std::memcpy(answer, c.bytes, kNonceBytes);
  Mac(secret, "connector", a, c.bytes, answer + kNonceBytes);
  st = socket.SendAll(answer, sizeof answer);
  if (!st.ok()) return Ended(st, "answer");
  unsigned char proof[kProofBytes];
  st = deadline.RecvAll(proof, sizeof proof);
  if (!st.ok()) return Ended(st, "proof");
  if (IsRefusal(proof)) return Status::Rejected("the peer refused our secret (P3_SECRET differs?)");
  unsigned char expected[kMacBytes];
  Mac(secret, "acceptor", a, c.bytes, expected);
  if (CRYPTO_memcmp(expected, proof, kMacBytes) != 0) {
    return Status::Rejected("the peer does not know the job's secret (P3_SECRET): it may be impersonating a node");
  }
  return Status::Ok();
}

Status ConnectAuthenticated(const std::string& host, uint16_t port, int buffer_bytes, const std::string& secret,
                            double timeout_s, Socket* out) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  auto backoff = std::chrono::milliseconds(50);
  const std::string where = host + ":" + std::to_string(port);
  while (true) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    Socket s;
    Status st = Socket::Connect(host, port, buffer_bytes, std::max(left, 0.0), &s);
    if (!st.ok()) return st;  // Connect retried refused connections until the deadline already
    st = AuthenticateToAcceptor(s, secret, std::min(kAttemptS, std::max(left, 0.1)));
    if (st.ok()) {
      *out = std::move(s);
      return st;
    }
    if (st.code() == Status::Code::kRejected || st.code() == Status::Code::kInvalid) return st;
    // Ended or timed out: the acceptor may be flooded (it closes the oldest pending handshakes) or restarting.
    if (Clock::now() + backoff >= deadline) {
      return Status::Timeout("no completed handshake with " + where + " within " +
                             std::to_string(static_cast<int>(timeout_s)) + " s (P3_CONNECT_TIMEOUT); the last "
                             "attempt: " + st.message());
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

}  // namespace p3
