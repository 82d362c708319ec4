"""Every benchmark suite: what it measures, how to run it, whether it needs root, and how long it takes.
`python -m benchmarks` prints this list; the sweeps' times are computed (sweeps.estimates: the bound scaled by
what measured rows showed), the others' are the times measured on an idle 2-core machine, as the Makefile
states them, or "-" where nobody has timed it."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    what: str
    command: str  # how to run it (a make target where there is one)
    root: bool  # network namespaces: needs root (the make targets use sudo otherwise)
    stated_time: str = "-"  # measured once on an idle 2-core machine; "-": not timed
    module: str = ""  # `python -m benchmarks NAME ARGS...` runs this module's main(ARGS) ("": not that way)


SUITES = (
    Suite("demo", "p3kv vs MXNet dist_sync (MXNet's P3, Horovod when asked), ResNet-50 on an emulated 4-host "
          "cluster, 95% CIs; writes only build/demo/", "make demo  (more systems: DEMO_SYSTEMS=\"p3 dist_sync "
          "mxnet-p3 horovod\")", root=True, module="benchmarks.suites.demo"),
    Suite("demo-full", "the 12-job comparison of all four systems, 20 timed iterations (the sweeps' demo): "
          "appends to results/sweeps/demo.csv, rewrites docs/benchmarks.md's tables", "make demo-full", root=True),
    Suite("sweeps", "the paper's evaluation: bandwidth, slice, ablation, scale, sensitivity, dilation, utilisation, "
          "shallow, cubic",
          "make sweeps  (one: python -m benchmarks.suites.sweeps NAME; a 2-hour part: NAME --resume --slice K/N)",
          root=True, module="benchmarks.suites.sweeps"),
    Suite("cluster_bench", "one comparison on the emulated cluster, any model/link/host count",
          "python -m benchmarks.suites.cluster_bench --model resnet50_v1 --bandwidth 1gbit",
          root=True, module="benchmarks.suites.cluster_bench"),
    Suite("tune", "each system's settings (Horovod fusion/cycle, MXNet big-array bound and P3 slice, p3kv slice "
          "and socket buffer) at a point: results/tuning/<point>.csv and best.json, which the comparisons use",
          "python -m benchmarks.suites.tune --headline  (one point: python -m benchmarks tune --equivalent 10)",
          root=True, module="benchmarks.suites.tune"),
    Suite("kvstore", "like-for-like kvstore pushpull with the same SGD, all systems, loopback",
          "make bench-kvstore", root=False),
    Suite("torch_loopback", "p3kv core pushpull of a model's gradients vs torch all_reduce over gloo in DDP's "
          "buckets, loopback, 95% CIs (writes build/torch_loopback/ unless --csv)",
          "python -m benchmarks.suites.torch_loopback_bench --model resnet50_v1 --workers 2 --repeats 5", root=False,
          module="benchmarks.suites.torch_loopback_bench"),
    Suite("gpu_bench", "a real ResNet-50 / VGG-19 on one GPU, 2 workers: p3kv.torch (both placements, the CUDA "
          "staging path) vs DDP (gloo) vs no exchange, 95% CIs, the staging thread's CPU (the lent GPU machine: "
          "tests/gpu/run_gpu_check.sh --bench; --device cpu is the dry run)",
          "python -m benchmarks.suites.gpu_bench --models resnet50_v1 vgg19 --out build/gpu-bench", root=False,
          module="benchmarks.suites.gpu_bench"),
    Suite("accuracy", "the paper's accuracy claim in miniature (digits MLP, 4 hosts on 100 Mbit links)",
          "make bench-accuracy", root=True, stated_time="25 min"),
    Suite("server", "the server's CPU per slice against a memcpy floor (C++ only, one thread)",
          "make bench-server", root=False, stated_time="about 1 min"),
    Suite("startup", "a job's first step and CPU, servers importing mxnet at start-up or not",
          "make bench-startup", root=False),
    Suite("transport", "the raw numpy P3Worker against MXNet's kvstores, loopback (not like-for-like)",
          "make bench-transport", root=False),
    Suite("soak", "memory of every process over a long p3kv job",
          "python -m benchmarks.suites.soak_bench --iters 10000", root=False, module="benchmarks.suites.soak_bench",
          stated_time="about 22 min"),
    Suite("link_overhead", "bytes a capped emulated link meters per payload byte (checks the bound)",
          "sudo .venv/bin/python -m benchmarks.suites.link_overhead", root=True),
    Suite("cfs_stall", "how long a host's CPU quota holds a real-time thread sharing a lock with it (the virtual "
          "GPU's timer), per CFS period and slice: results/cfs_stall.md",
          "python -m benchmarks.suites.cfs_stall_bench", root=True, stated_time="about 2 min",
          module="benchmarks.suites.cfs_stall_bench"),
    Suite("tcp_trace", "TCP's side of the headline comparison (the socket monitor, --tcp-trace): the share of "
          "the time data waited in a socket while no link on its path ran at its rate, per system, beside the "
          "simulator's error there: results/tcp_trace/summary.md",
          "python -m benchmarks.suites.sweeps bandwidth --models resnet50_v1 --equivalents 4 --repeats 6 "
          "--tcp-trace --results-dir benchmarks/results/tcp_trace (then --models inceptionv3 with --repeats 2, and "
          "cubic with --repeats 2), then python -m benchmarks.analysis.tcp_trace", root=True,
          stated_time="about 65 min"),
    Suite("kernels", "the server optimizer kernels, ns per element",
          "python -m benchmarks.suites.kernel_bench", root=False),
    Suite("sim", "the simulator: fit, validate against the emulated rows, the paper's evaluation at scale",
          "make sim", root=False, stated_time="about 100 s"),
)
