// Internal. Mutual challenge-response authentication of a new TCP connection with the job's shared
// secret (HMAC-SHA256 from OpenSSL), before any p3kv frame is exchanged:
//   acceptor -> connector: "P3KVAUTH" + version + 32-byte nonce A
//   connector -> acceptor: 32-byte nonce C + HMAC(secret, "connector" | A | C)
//   acceptor -> connector: HMAC(secret, "acceptor" | A | C), or 32 zero bytes: "your secret is wrong"
// A fresh nonce per connection defeats replayed handshakes; each side proves it holds the secret without
// sending it. Nothing is encrypted afterwards (see the README's threat model).
//
// The explicit refusal lets a connector tell a wrong secret (final: fail at once) from a connection that merely
// ended (the acceptor was busy, closed the oldest of a flood of pending handshakes, or restarted: retry).
#pragma once

#include <cstddef>
#include <string>

#include "socket.h"
#include "p3/status.h"

namespace p3 {

constexpr size_t kChallengeBytes = 8 + 1 + 32;
constexpr size_t kAnswerBytes = 32 + 32;
constexpr size_t kProofBytes = 32;

// The acceptor's side as two steps, for an event loop that serves many connections (gatekeeper.h).
// Thread-compatible.
class AcceptorHandshake {
 public:
  // Draws the nonce; the challenge to send is then challenge()[0..kChallengeBytes).
  Status Start();
  const unsigned char* challenge() const { return challenge_; }
  // Ok with `reply` = the proof if `answer` proves `secret`; otherwise Rejected, with `reply` = the refusal.
  // Either way the acceptor sends `reply` (kProofBytes).
  Status Check(const std::string& secret, const unsigned char answer[kAnswerBytes],
               unsigned char reply[kProofBytes]) const;

 private:
  unsigned char challenge_[kChallengeBytes] = {};
};

// Blocking forms. Each returns Rejected when the peer does not prove the secret (or refuses ours), Invalid
// when it does not speak the handshake at all, PeerLost when the connection ended during the handshake and
// Timeout when a step took longer than `timeout_s` in all (the socket's receive timeout is restored afterwards).
Status AuthenticateConnector(const Socket& socket, const std::string& secret, double timeout_s);
Status AuthenticateToAcceptor(const Socket& socket, const std::string& secret, double timeout_s);

// Connects to host:port and authenticates, retrying refused, reset, timed-out and ended attempts (a busy or
// not yet listening acceptor) with backoff until `timeout_s` has passed; a wrong secret or a peer that is not a
// p3kv node fails at once.
Status ConnectAuthenticated(const std::string& host, uint16_t port, int buffer_bytes, const std::string& secret,
                            double timeout_s, Socket* out);

}  // namespace p3
