"""p3kv's MXNet adapter: kvstore 'p3' on top of p3kv.core.

hook (makes `import p3kv` enough for kvstore='p3'; the only module `import p3kv` loads from here, and it
imports no mxnet), kvstore (the KVStore), forward_order (priorities from the forward pass), shipped_optimizer
and checkpoint (the optimizer and its states on the servers), optimizer_host and server_kernels (a server's
side of that optimizer), server (the launcher's server: a core P3Server with that optimizer plugged in,
``python -m p3kv.mxnet.server``), sockeye_train (``python -m p3kv.mxnet.sockeye_train``).
"""
