// Internal. Mutual challenge-response authentication of a new TCP connection with the job's shared
// secret (HMAC-SHA256 from OpenSSL), before any p3kv frame is exchanged:
//   acceptor -> connector: "P3KVAUTH" + version + 32-byte nonce A
//   connector -> acceptor: 32-byte nonce C + HMAC(secret, "connector" | A | C)
//   acceptor -> connector: HMAC(secret, "acceptor" | A | C)
// A fresh nonce per connection defeats replayed handshakes; each side proves it holds the secret without
// sending it. Nothing is encrypted afterwards (see the README's threat model).
#pragma once

#include <string>

#include "p3/socket.h"
#include "p3/status.h"

namespace p3 {

// Each returns Rejected when the peer does not prove the secret, Invalid when it does not speak the
// handshake at all; both bounded by `timeout_s` (the socket's receive timeout is restored afterwards).
Status AuthenticateConnector(const Socket& socket, const std::string& secret, double timeout_s);
Status AuthenticateToAcceptor(const Socket& socket, const std::string& secret, double timeout_s);

}  // namespace p3
