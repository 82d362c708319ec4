"""Process tooling: start a p3kv job (or an MXNet baseline) on this machine and supervise it.

    python -m p3kv.launch -n 2 -s 2 -- python train.py --kvstore p3

job (Job, KVStore: what to run), launcher (each process's environment, and the run), baselines (MXNet's
dist_sync and mxnet-p3 jobs), horovod (Horovod jobs) and rendezvous (their rendezvous process), supervisor
(runs the processes together), cli (the command line); torchrun (torchrun's variables, exported to workers and
read by a script torchrun started) and child_services (the scheduler and servers such a script starts itself).
From Python: ``launch(Job(command=("python", "train.py"), num_workers=2, num_servers=2))``.
"""

from p3kv.launch.cli import job_from_args, main
from p3kv.launch.job import BASELINE_VARIABLE, Job, KVStore
from p3kv.launch.launcher import launch, plan

__all__ = ["BASELINE_VARIABLE", "Job", "KVStore", "job_from_args", "launch", "main", "plan"]
