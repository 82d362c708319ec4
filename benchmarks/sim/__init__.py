"""A discrete-event simulator of synchronous data-parallel training iterations (issue 13).

model.py: per-layer compute and parameter sizes (the emulated cluster's compute model).
cluster.py: hosts, NICs, each host's CPU.  engine.py: the event loop, processor-shared CPUs, threads, the virtual
GPU, the max-min fair network.  ps.py: parameter-server systems (p3kv, its ablations, MXNet dist_sync, MXNet's
P3).  ring.py: Horovod 0.28.1's fused ring allreduce.  settings.py: each system's tuned or default settings.
costs.py: CPU constants fitted on loopback measurements.  validate.py (held-out validation), paper.py, run.py:
the experiments.
"""
