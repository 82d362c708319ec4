"""p3kv: Priority-based Parameter Propagation (P3, SysML'19) as a parameter-server KVStore.

`import p3kv` makes `kvstore='p3'` available to MXNet (now, or as soon as mxnet is imported) without importing
mxnet itself. `P3Worker` and `P3Server` wrap the C++ core; `python -m p3kv.launch` starts a local job.

Layers: p3kv.core (P3 on numpy buffers, no MXNet), p3kv.mxnet (kvstore 'p3' and the servers' MXNet optimizer),
p3kv.launch (process tooling); p3kv._p3 is the C++ core.
"""

import glob
import importlib
import os
import sys

from p3kv.core.errors import ConfigError, P3Error, P3TimeoutError
from p3kv.mxnet import hook

__version__ = "0.1.0"
__all__ = ["ConfigError", "P3Error", "P3TimeoutError", "P3Server", "P3Worker", "__version__"]


def __getattr__(name):
    # Imported lazily so that `import p3kv` stays cheap and works before the extension is built.
    if name == "_p3":  # `from p3kv import _p3` asks here first
        return _load_core()
    if name == "P3Worker":
        from p3kv.core.worker import P3Worker

        return P3Worker
    if name == "P3Server":
        from p3kv.core.server import P3Server

        return P3Server
    raise AttributeError(f"module 'p3kv' has no attribute {name!r}")


def _load_core():
    """The C++ core (the `_p3` extension), or an ImportError that says why it is missing and what to do."""
    try:
        return importlib.import_module("p3kv._p3")
    except ModuleNotFoundError as e:
        if e.name != "p3kv._p3":
            raise
    here = os.path.dirname(os.path.abspath(__file__))
    built = [os.path.join(os.path.abspath(p or os.curdir), "p3kv") for p in sys.path]
    built = [d for d in dict.fromkeys(built) if os.path.realpath(d) != os.path.realpath(here)
             and glob.glob(os.path.join(d, "_p3*.so")) + glob.glob(os.path.join(d, "_p3*.pyd"))]
    if built:
        why = (f"Python imported p3kv from {here}, a source folder whose core is not built, and it shadows the "
               f"installed p3kv at {built[0]} (Python puts the current directory, or the script's, first on "
               "its path). Run from another directory to use the installed one, or build the core here: ")
    else:
        why = f"p3kv's C++ core (p3kv/_p3*.so) is not built in {here}. Build it: "
    raise ImportError(f"cannot import p3kv's C++ core: {why}pip install -e . (an editable install that builds it "
                      "in place), or python setup.py build_ext --inplace, in the p3kv checkout",
                      name="p3kv._p3", path=here)


hook.activate()
