"""p3kv's core: P3 on numpy buffers, knowing nothing of MXNet (it never imports it).

config (the one table of environment variables), keys (user keys to key ids), node (what every role
shares), worker (P3Worker), server (P3Server), scheduler (rendezvous), requests (control requests to servers).
Each role runs as ``python -m p3kv.core.ROLE`` (scheduler, server); the C++ core is p3kv._p3, and the
exceptions of every layer are in p3kv.core.errors.
"""
