"""A server as `python -m p3kv.core.server` runs it, in a process where importing torch or mxnet fails: a server
of a torch job (placement='server' included) must import neither. Prints which of them got loaded anyway."""

from __future__ import annotations

import importlib.abc
import sys

BLOCKED = ("torch", "mxnet")


class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} imported by a framework-free server")
        return None


sys.meta_path.insert(0, Refuse())

from p3kv.core import server  # noqa: E402  (after the import guard)

code = server.main()
print("server imported", [m for m in BLOCKED if m in sys.modules], flush=True)
sys.exit(code or (3 if any(m in sys.modules for m in BLOCKED) else 0))
