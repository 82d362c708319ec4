"""p3kv: Priority-based Parameter Propagation (P3, SysML'19) as a parameter-server KVStore.

`import p3kv` makes `kvstore='p3'` available to MXNet (now, or as soon as mxnet is imported).
`P3Worker` and `P3Server` wrap the C++ core; `python -m p3kv.launch` starts a local job.
"""

from p3kv import mxnet_hook
from p3kv.errors import ConfigError, P3Error, P3TimeoutError

__version__ = "0.1.0"
__all__ = ["ConfigError", "P3Error", "P3TimeoutError", "P3Server", "P3Worker", "__version__"]


def __getattr__(name):
    # Imported lazily so that `import p3kv` stays cheap and works before the extension is built.
    if name == "P3Worker":
        from p3kv.worker import P3Worker

        return P3Worker
    if name == "P3Server":
        from p3kv.server import P3Server

        return P3Server
    raise AttributeError(f"module 'p3kv' has no attribute {name!r}")


mxnet_hook.activate()
