#include "p3/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

namespace p3 {
namespace {

constexpr char kGreeting[8] = {'P', '3', 'K', 'V', 'A', 'U', 'T', 'H'};
constexpr uint8_t kHandshakeVersion = 1;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;  // SHA-256

struct Nonce {
  unsigned char bytes[kNonceBytes];
};

Status Random(Nonce* n) {
  if (RAND_bytes(n->bytes, kNonceBytes) != 1) return Status::IoError("no randomness for the handshake nonce");
  return Status::Ok();
}

void Mac(const std::string& secret, const char* label, const Nonce& a, const Nonce& c, unsigned char out[kMacBytes]) {
  std::string msg(label);
  msg.append(reinterpret_cast<const char*>(a.bytes), kNonceBytes);
  msg.append(reinterpret_cast<const char*>(c.bytes), kNonceBytes);
  unsigned int len = kMacBytes;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), out, &len);
}

// Restores "no receive timeout" when the handshake is over (data connections block for as long as needed).
class ReceiveDeadline {
 public:
  ReceiveDeadline(const Socket& s, double timeout_s) : socket_(s) { socket_.SetReceiveTimeout(timeout_s); }
  ~ReceiveDeadline() { socket_.SetReceiveTimeout(0); }

 private:
  const Socket& socket_;
};

Status Refused(const Status& st, const char* step) {
  if (st.code() == Status::Code::kTimeout) return Status::Rejected(std::string("no ") + step + " in time");
  return Status::Rejected(std::string("connection ended during the handshake (") + step + "): " + st.message());
}

}  // namespace

Status AuthenticateConnector(const Socket& socket, const std::string& secret, double timeout_s) {
  ReceiveDeadline deadline(socket, timeout_s);
  Nonce a, c;
  Status st = Random(&a);
  if (!st.ok()) return st;
  unsigned char hello[sizeof kGreeting + 1 + kNonceBytes];
  std::memcpy(hello, kGreeting, sizeof kGreeting);
  hello[sizeof kGreeting] = kHandshakeVersion;
  std::memcpy(hello + sizeof kGreeting + 1, a.bytes, kNonceBytes);
  st = socket.SendAll(hello, sizeof hello);
  if (!st.ok()) return Refused(st, "challenge");
  unsigned char answer[kNonceBytes + kMacBytes];
  st = socket.RecvAll(answer, sizeof answer);
  if (!st.ok()) return Refused(st, "answer to the challenge");
  std::memcpy(c.bytes, answer, kNonceBytes);
  unsigned char expected[kMacBytes];
  Mac(secret, "connector", a, c, expected);
  if (CRYPTO_memcmp(expected, answer + kNonceBytes, kMacBytes) != 0) {
    return Status::Rejected("the peer does not know the job's secret (P3_SECRET): wrong secret, another job, or "
                            "not a p3kv node");
  }
  unsigned char proof[kMacBytes];
  Mac(secret, "acceptor", a, c, proof);
  st = socket.SendAll(proof, sizeof proof);
  return st.ok() ? st : Refused(st, "proof");
}

Status AuthenticateToAcceptor(const Socket& socket, const std::string& secret, double timeout_s) {
  ReceiveDeadline deadline(socket, timeout_s);
  unsigned char hello[sizeof kGreeting + 1 + kNonceBytes];
  Status st = socket.RecvAll(hello, sizeof hello);
  if (!st.ok()) return Refused(st, "challenge");
  if (std::memcmp(hello, kGreeting, sizeof kGreeting) != 0) {
    return Status::Invalid("the peer is not a p3kv node (no authentication challenge)");
  }
  if (hello[sizeof kGreeting] != kHandshakeVersion) {
    return Status::Invalid("the peer speaks handshake version " + std::to_string(hello[sizeof kGreeting]) +
                           ", expected " + std::to_string(kHandshakeVersion) + " (mixed p3kv versions?)");
  }
  Nonce a, c;
  std::memcpy(a.bytes, hello + sizeof kGreeting + 1, kNonceBytes);
  st = Random(&c);
  if (!st.ok()) return st;
  unsigned char answer[kNonceBytes + kMacBytes];
  std::memcpy(answer, c.bytes, kNonceBytes);
  Mac(secret, "connector", a, c, answer + kNonceBytes);
  st = socket.SendAll(answer, sizeof answer);
  if (!st.ok()) return Refused(st, "answer");
  unsigned char proof[kMacBytes];
  st = socket.RecvAll(proof, sizeof proof);
  if (!st.ok()) return Refused(st, "proof: the peer refused our secret (P3_SECRET differs?)");
  unsigned char expected[kMacBytes];
  Mac(secret, "acceptor", a, c, expected);
  if (CRYPTO_memcmp(expected, proof, kMacBytes) != 0) {
    return Status::Rejected("the peer does not know the job's secret (P3_SECRET): it may be impersonating a node");
  }
  return Status::Ok();
}

}  // namespace p3
