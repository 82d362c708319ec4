"""A discrete-event simulator of synchronous data-parallel training iterations (issue 13).

model.py: per-layer compute and parameter sizes (the emulated cluster's compute model).
cluster.py: hosts, NICs, CPU costs.  engine.py: the event loop and the queues.
ps.py: parameter-server systems (p3kv, its ablations, MXNet dist_sync, MXNet's P3).  ring.py: Horovod-style ring
allreduce.  costs.py: CPU constants fitted on measurements.  validate.py, paper.py, run.py: the experiments.
"""
