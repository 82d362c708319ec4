"""The PyTorch systems of the emulated-cluster comparison (issue 27), as cluster_job.py runs them. Every one runs
benchmarks/workloads/torch_worker.py (the shape file's model on the virtual GPU, SGD with momentum and weight
decay) on one worker per host:

- ``torch-p3kv``: p3kv.torch, worker placement (the servers sum; each worker's update on its virtual GPU);
- ``torch-p3kv-server``: p3kv.torch, server placement (the paper's: torch's SGD per slice on the servers' CPU);
  both started by `python -m p3kv.launch --servers core` (framework-free servers) beside one server per host;
- ``ddp``: DistributedDataParallel over gloo, started by torchrun as DDP's users start it (one rank per host, no
  servers; static rendezvous on host 0). Gloo takes the address of GLOO_SOCKET_IFNAME (the emulated host's eth0):
  without it, gloo uses the address the hostname resolves to, which every namespace shares.
"""

from __future__ import annotations

WORKER_MODULE = "benchmarks.workloads.torch_worker"
SYSTEMS = ("ddp", "torch-p3kv", "torch-p3kv-server")
# cluster_job.KVSTORES' entries: (the launcher's --kvstore, or "torchrun"; extra environment; extra worker flags).
KVSTORES = {
    "torch-p3kv": ("p3", {}, ["--system", "p3kv", "--placement", "worker"]),
    "torch-p3kv-server": ("p3", {}, ["--system", "p3kv", "--placement", "server"]),
    "ddp": ("torchrun", {"GLOO_SOCKET_IFNAME": "eth0"}, ["--system", "ddp"]),
}
# Where server placement copies the servers' new values into the parameters (the rows' weight_copy): on the virtual
# GPU, as a GPU host's device-to-device copy (torch_compute.copy_weights_on_the_virtual_gpu). "": no such copy (the
# other systems), or a server-placement row from before, whose host CPU made the copy (superseded.outdated_by).
WEIGHT_COPY = {"torch-p3kv-server": "virtual GPU"}
# Where every system's own passes over the gradients during backward run (the rows' gradient_work): DDP's bucket
# copies and p3kv.torch's 1/W scaling into its send buffers, kernels on a GPU host, on the virtual GPU
# (emulation/gradient_work.py). "": a row from before, whose training loop made them on the host's CPU.
GRADIENT_WORK = "virtual GPU"


def emulation_columns(kvstore: str) -> dict[str, str]:
    """What a run of `kvstore` records of where the emulation put the torch systems' device work (weight_copy,
    gradient_work; "" for the other systems)."""
    return {"weight_copy": WEIGHT_COPY.get(kvstore, ""), "gradient_work": GRADIENT_WORK if kvstore in SYSTEMS else ""}


LAUNCHER_FLAGS = {"torch-p3kv": ["--servers", "core"], "torch-p3kv-server": ["--servers", "core"]}
NO_SERVERS = ("ddp",)
# The sweep (`sweeps.py torch`): the same emulation as the MXNet systems' (compute, dilation, CPU quotas, SGD);
# ResNet-50 and VGG-19 from link-bound to compute-bound around their headline points (4 and 15 Gbps-equivalent),
# at least SWEEP_REPEATS interleaved repeats (the table's CIs resample jobs: analysis/torch_comparison.py).
SWEEP = [("resnet50_v1", [2, 4, 10]), ("vgg19", [5, 15, 30])]
SWEEP_REPEATS = 5
TORCHRUN_MONITOR_S = 1  # how often torchrun's agent looks at its rank (its default, 0.1 s, costs the host CPU)


def torchrun_argv(python: str, hosts: int, node_rank: int, master: str, port: int, worker_argv: list[str],
                  local_addr: str) -> list[str]:
    """One host's torchrun: `worker_argv` is [python, "-m", module, args...], as cluster_job builds it.
    `local_addr`: the host's own address (torchrun would otherwise take the hostname's, which every namespace
    shares)."""
    if worker_argv[1:2] != ["-m"]:
        raise ValueError(f"not a `python -m module` command: {worker_argv[:3]}")
    return [python, "-m", "torch.distributed.run", "--nnodes", str(hosts), "--nproc-per-node", "1",
            "--node-rank", str(node_rank), "--master-addr", master, "--master-port", str(port),
            "--local-addr", local_addr, "--monitor-interval", str(TORCHRUN_MONITOR_S), "-m", *worker_argv[2:]]


def sweep(args, point) -> list:
    """The sweep's points (sweeps.py's `_point(name, args, model, kvstore, equivalent)` makes each); --models picks
    among its two models, --equivalents among their rates, --kvstores among its systems."""
    chosen = [(m, eqs) for m, eqs in SWEEP if m in args.models] or SWEEP
    only = getattr(args, "only_equivalents", None)
    systems = [kv for kv in SYSTEMS if kv in getattr(args, "kvstores", SYSTEMS)] or SYSTEMS
    return [point("torch", args, m, kv, eq) for m, eqs in chosen for eq in eqs if not only or eq in only
            for kv in systems]
