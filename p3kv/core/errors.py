"""Exceptions raised by p3kv. Every message names the problem and what to do about it.

Shared by every layer (core, mxnet, launch), and raised by the C++ core's bindings, which look these classes up
by this module's name (cpp/python/bindings.cc)."""


class P3Error(RuntimeError):
    """A p3kv operation failed (a peer died, a server rejected a request, a wait timed out)."""


class ConfigError(P3Error, ValueError):
    """The job description (environment variables or arguments) is missing or inconsistent."""


class P3TimeoutError(P3Error, TimeoutError):
    """A blocking wait exceeded its timeout (P3_TIMEOUT or the timeout argument)."""


class UnsupportedRequest(P3Error):
    """A server has no handler for a control request (it runs without a request handler: aggregate only)."""
