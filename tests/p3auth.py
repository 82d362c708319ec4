"""The connector's side of p3kv's connection handshake (cpp/src/handshake.cc), in Python, for tests that talk to a
scheduler or server directly.

The acceptor (scheduler or server) opens with ``b"P3KVAUTH" + bytes([1]) + A`` (A: a 32-byte nonce); the
connector answers ``C + HMAC-SHA256(secret, b"connector" + A + C)`` (C: its own 32-byte nonce); the acceptor
proves it knows the secret too with ``HMAC-SHA256(secret, b"acceptor" + A + C)``, or sends 32 zero bytes
(REFUSED) when the answer does not prove the secret, then hangs up. The secret is P3_SECRET as UTF-8
bytes (an empty secret is an empty HMAC key).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket

GREETING = b"P3KVAUTH"
VERSION = 1
NONCE_BYTES = 32
MAC_BYTES = 32
CHALLENGE_BYTES = len(GREETING) + 1 + NONCE_BYTES
REFUSED = bytes(MAC_BYTES)  # the acceptor's "your secret is wrong" in place of its proof


def mac(secret: str | bytes, label: bytes, acceptor_nonce: bytes, connector_nonce: bytes) -> bytes:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, label + acceptor_nonce + connector_nonce, hashlib.sha256).digest()


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """n bytes, or ConnectionError if the peer closes first (socket timeouts propagate)."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"the peer closed the connection after {len(data)} of {n} bytes")
        data += chunk
    return data


def read_challenge(sock: socket.socket) -> bytes:
    """The acceptor's nonce A, after checking the greeting and version."""
    hello = recv_exactly(sock, CHALLENGE_BYTES)
    assert hello[:len(GREETING)] == GREETING, f"not a p3kv handshake: {hello!r}"
    assert hello[len(GREETING)] == VERSION, f"handshake version {hello[len(GREETING)]}"
    return hello[len(GREETING) + 1:]


def answer(secret: str | bytes, acceptor_nonce: bytes, connector_nonce: bytes | None = None) -> bytes:
    """The connector's answer to challenge A: its nonce C followed by the HMAC."""
    c = os.urandom(NONCE_BYTES) if connector_nonce is None else connector_nonce
    return c + mac(secret, b"connector", acceptor_nonce, c)


def authenticate(sock: socket.socket, secret: str | bytes) -> bytes:
    """Run the whole handshake as a connector; returns the answer sent. Raises AssertionError if the acceptor's
    proof is wrong, ConnectionError if it refuses our secret or hangs up."""
    a = read_challenge(sock)
    sent = answer(secret, a)
    sock.sendall(sent)
    proof = recv_exactly(sock, MAC_BYTES)
    if proof == REFUSED:
        raise ConnectionError("the acceptor refused our secret")
    assert hmac.compare_digest(proof, mac(secret, b"acceptor", a, sent[:NONCE_BYTES])), \
        "the acceptor does not know the secret"
    return sent
