"""CPU constants, fitted on loopback measurements: benchmarks/results/kvstore_bench.csv, transport.csv,
kvstore_bench_slice10000/ and server_slice.csv. No emulated-cluster point is used here (validate.py fits the
emulated links' own CPU on its fit split only).

Both benchmarks run 2 workers + 2 servers of each system (Horovod: 2 ranks) on loopback (no bandwidth limit, no
compute) on this 2-core machine, pushing and receiving every parameter array of ResNet-50 and VGG-19 per
iteration through MXNet's engine. Nothing but CPU limits them, so the simulator, run on the same setup (every
process's threads time-sharing the 2 cores, unlimited links), must reproduce their s/iter; the two models give
two equations for two unknowns (core-seconds per message or part, per byte), fitted in three steps:

1. Transport, without an optimizer: p3kv on kvstore_bench's `p3-noopt` (its servers only sum) at its default
   50,000-element slices and at 10,000 (kvstore_bench --slice-size 10000): with one slice size messages and bytes
   grow together and the two unknowns cannot be told apart, so its four equations are solved by least squares.
   MXNet's P3 on transport.csv (no optimizer there); dist_sync on kvstore_bench's SGD rows, its update folded
   in (TRANSPORT_SOURCE says why not transport.csv).
2. The optimizer's update (SGD with momentum), the transport held: MXNet's P3 on its workers' CPU (loopback runs
   update there), on its kvstore_bench rows with SGD. p3kv's update is not
   fitted end to end: on loopback its SGD rows differ from p3-noopt by less than the noise, so a fit there
   amplifies noise. It is measured directly instead: the C++ SGD kernel per slice on the server's hot path
   (server_slice.csv, benchmarks/suites/server_bench.py), a line through its slice sizes.
3. Horovod's allreduce CPU (per tensor, per byte), its workers' CPU update taken from MXNet's P3 (the same MXNet
   updater on the workers).

No constant here is a guess.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import multiprocessing
import pathlib
import statistics
from collections.abc import Callable, Hashable

from benchmarks.sim import ddp as ddp_lib
from benchmarks.sim import model as model_lib
from benchmarks.sim import ring
from benchmarks.sim.cluster import Cluster, CpuCosts
from benchmarks.sim.ps import SGD_ACCESSES, SYSTEMS, PSSystem, simulate

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "results"
TRANSPORT_CPUS = 2  # the cpus column of both benchmarks
FIT_MODELS = ("resnet50_v1", "vgg19")
# Which fitted system stands for each simulated one (the ablations are p3kv with other settings).
# p3kv.torch runs p3kv's transport and server kernels; DDP's Gloo ring is the library Horovod's ring runs here.
MEASURED_AS = {"p3": "p3", "p3-slicing-only": "p3", "p3-priority-only": "p3", "p3-priority-split": "p3",
               "dist_sync": "dist_sync", "mxnet-p3": "mxnet-p3", "torch-p3kv": "p3", "torch-p3kv-server": "p3",
               "ddp": "horovod"}
# Step 1's sources per system: (file under results/, its system name there, slice size: None for the default).
TRANSPORT_SOURCE = {
    "p3": [("kvstore_bench.csv", "p3-noopt", None),
           ("kvstore_bench_slice10000/kvstore_bench.csv", "p3-noopt", 10_000)],
    # Not transport.csv: its dist_sync rows, without an optimizer, are slower than kvstore_bench's with SGD (VGG-19:
    # 3.03 against 2.36 s/iter; it ran under a 1-minute load of 4-8). So dist_sync's transport is fitted on
    # kvstore_bench's SGD rows, its servers' update folded in (update: none of its own).
    "dist_sync": [("kvstore_bench.csv", "dist_sync", None)],
    "mxnet-p3": [("transport.csv", "mxnet-p3", None)],
}


# Per results file: the column naming the system and the column holding s/iter. transport.csv has one row per run
# (its median), kvstore_bench.csv one row per timed iteration; either way the median is over the file's rows.
MEDIAN_COLUMNS = {"transport.csv": ("kvstore", "median_s"), "kvstore_bench.csv": ("system", "time_s")}


def medians(source: str) -> dict[tuple[str, str], float]:
    """(model, system) -> median s/iter over the ok rows of results/`source`."""
    system_column, time_column = MEDIAN_COLUMNS[pathlib.Path(source).name]
    times: dict[tuple[str, str], list[float]] = {}
    with open(RESULTS / source) as f:
        for row in csv.DictReader(f):
            if row["status"] == "ok":
                times.setdefault((row["model"], row[system_column]), []).append(float(row[time_column]))
    return {k: statistics.median(v) for k, v in times.items()}


def _slice_line(path: pathlib.Path, optimizer: str, column: str, workers: int, share: float) -> CpuCosts:
    """The least-squares line through `column` (ns) x `share` against slice bytes (float32) on the rows of
    server_slice.csv with `optimizer` and `workers` pushers (kvstore_bench has 2)."""
    points = []
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["optimizer"] == optimizer and int(row["workers"]) == workers:
                points.append((int(row["count"]) * 4, float(row[column]) * 1e-9 * share))
    if len(points) < 2:
        raise ValueError(f"{path} has fewer than two slice sizes with optimizer {optimizer} and {workers} workers; "
                         "rerun benchmarks/suites/server_bench.py")
    slope, intercept = statistics.linear_regression([b for b, _ in points], [s for _, s in points])
    return CpuCosts(max(intercept, 0.0), slope)


def server_update(path: pathlib.Path = RESULTS / "server_slice.csv", workers: int = 2) -> CpuCosts:
    """p3kv's SGD update per slice, measured on the server's hot path: the kernel's CPU time per slice."""
    return _slice_line(path, "sgd", "kernel_cpu_ns_median", workers, 1.0)


@functools.cache
def server_aggregate(path: pathlib.Path = RESULTS / "server_slice.csv", workers: int = 2) -> CpuCosts:
    """p3kv's consumer thread summing one push of a slice, measured on the server's hot path without an optimizer
    (server_bench.py: all `workers` pushes of a slice summed, then the aggregate copied to the value), per push.
    The part of a push's transport cost that p3kv's consumer, not the connection's receive thread, pays (ps.py's
    `receivers`)."""
    return _slice_line(path, "none", "work_cpu_ns_median", workers, 1.0 / workers)


def with_aggregate(system: PSSystem) -> PSSystem:
    """The system with its consumer's measured sum where it reads each connection on a thread of its own."""
    return dataclasses.replace(system, aggregate=server_aggregate()) if system.receivers == "connection" else system


def no_compute(profile: model_lib.ModelProfile) -> model_lib.ModelProfile:
    layers = tuple(model_lib.Layer(0.0, 0.0, layer.arrays, layer.itemsize) for layer in profile.layers)
    return dataclasses.replace(profile, layers=layers)


TRANSPORT_CLUSTER = Cluster(hosts=4, rate_bps=None, layout="separate", shared_cores=TRANSPORT_CPUS)
RING_CLUSTER = Cluster(hosts=2, rate_bps=None, shared_cores=TRANSPORT_CPUS)  # kvstore_bench's 2 Horovod ranks


def transport_seconds(system: PSSystem, model: str) -> float:
    if system.update_on == "workers-gpu":  # loopback runs have no GPU: their workers update on the CPU
        system = dataclasses.replace(system, update_on="workers-cpu", gpu_accesses=0)
    return simulate(no_compute(model_lib.load(model)), TRANSPORT_CLUSTER, system, iters=3).iteration_s


def ring_seconds(horovod: ring.Horovod, model: str) -> float:
    return ring.iteration_seconds(no_compute(model_lib.load(model)), RING_CLUSTER, horovod=horovod)


def fit_pair(seconds: Callable[[CpuCosts, Hashable], float], measured: dict[Hashable, float],
             rounds: int = 8) -> CpuCosts:
    """Gauss-Newton on the two unknowns of a CpuCosts (log scale keeps them positive): the costs whose
    seconds(costs, case) best match measured[case] in squared log error. Two cases are solved exactly; more are
    fitted by least squares. The simulated time is close to linear in the costs, so a few rounds suffice."""
    cases = list(measured)
    x = [math.log(20e-6), math.log(1e-9)]  # start: 20 us per message, 1 ns per byte

    def residuals(v: list[float]) -> list[float]:
        costs = CpuCosts(math.exp(v[0]), math.exp(v[1]))
        return [math.log(seconds(costs, case) / measured[case]) for case in cases]

    for _ in range(rounds):
        r = residuals(x)
        if max(abs(e) for e in r) < 0.005:
            break
        h = 0.05
        jac = []  # jac[j][i]: d residual i / d unknown j
        for j in range(2):
            y = list(x)
            y[j] += h
            jac.append([(a - b) / h for a, b in zip(residuals(y), r)])
        # The normal equations (J^T J) d = -J^T r, 2 x 2.
        a = sum(v * v for v in jac[0])
        b = sum(u * v for u, v in zip(jac[0], jac[1]))
        d = sum(v * v for v in jac[1])
        g0 = sum(u * e for u, e in zip(jac[0], r))
        g1 = sum(v * e for v, e in zip(jac[1], r))
        det = a * d - b * b
        if abs(det) < 1e-12 * max(1.0, a * d):  # one unknown does not matter: move the per-byte cost only
            step = [0.0, -g1 / d if d else 0.0]
        else:
            step = [(-d * g0 + b * g1) / det, (b * g0 - a * g1) / det]
        x = [x[0] + max(-2.0, min(2.0, step[0])), x[1] + max(-2.0, min(2.0, step[1]))]
        if max(abs(v) for v in step) < 1e-4:
            break
    return CpuCosts(math.exp(x[0]), math.exp(x[1]))


def _fit_transport(kv: str) -> CpuCosts:
    measured: dict[Hashable, float] = {}
    for source, name, slice_size in TRANSPORT_SOURCE[kv]:
        found = medians(source)
        measured.update({(m, slice_size): found[(m, name)] for m in FIT_MODELS})

    def seconds(costs: CpuCosts, case: Hashable) -> float:
        model, slice_size = case
        system = dataclasses.replace(with_aggregate(SYSTEMS[kv]).with_costs(costs), update_on="workers-cpu"
                                     if kv == "mxnet-p3" else SYSTEMS[kv].update_on, gpu_accesses=0)
        if slice_size:
            system = dataclasses.replace(system, slice_size=slice_size)
        return transport_seconds(system, model)

    return fit_pair(seconds, measured)


def _fit_update(kv_and_transport: tuple[str, CpuCosts]) -> CpuCosts:
    kv, transport = kv_and_transport
    base = dataclasses.replace(with_aggregate(SYSTEMS[kv]).with_costs(transport), gpu_accesses=0,
                               update_on="workers-cpu" if kv == "mxnet-p3" else "servers")
    found = medians("kvstore_bench.csv")
    return fit_pair(lambda costs, m: transport_seconds(dataclasses.replace(base, update=costs), m),
                    {m: found[(m, kv)] for m in FIT_MODELS})


def as_dict(found: Fitted) -> dict:
    """The fitted constants as JSON-friendly numbers (seconds per message or part, seconds per byte)."""
    def pair(c: CpuCosts) -> list[float]:
        return [c.per_message, c.per_byte]

    return {"transport": {k: pair(v) for k, v in found.transport.items()},
            "update": {k: pair(v) for k, v in found.update.items()},
            "horovod": {"cpu": pair(found.horovod.cpu), "update": pair(found.horovod.update)}}


def from_dict(data: dict) -> Fitted:
    return Fitted({k: CpuCosts(*v) for k, v in data["transport"].items()},
                  {k: CpuCosts(*v) for k, v in data["update"].items()},
                  ring.Horovod(CpuCosts(*data["horovod"]["cpu"]), CpuCosts(*data["horovod"]["update"]),
                               update_on="workers-cpu"))


@dataclasses.dataclass(frozen=True)
class Fitted:
    transport: dict[str, CpuCosts]  # p3, dist_sync, mxnet-p3: per message, per byte (no optimizer)
    update: dict[str, CpuCosts]  # the same systems' SGD update: per part, per byte
    horovod: ring.Horovod  # Horovod's allreduce CPU and its workers' update


@functools.cache
def fitted(processes: int = 2) -> Fitted:
    """Every fitted constant (the module doc's steps 1-3); the fits of one step run in parallel."""
    kvs = sorted(TRANSPORT_SOURCE)
    # p3kv's update is measured (the module doc's step 2); dist_sync's is folded into its transport (above).
    fitted_update = [kv for kv in kvs if kv not in ("p3", "dist_sync")]
    with multiprocessing.Pool(processes) as pool:
        transport = dict(zip(kvs, pool.map(_fit_transport, kvs, chunksize=1)))
        update = dict(zip(fitted_update, pool.map(_fit_update, [(kv, transport[kv]) for kv in fitted_update],
                                                   chunksize=1)))
    update["p3"] = server_update()
    update["dist_sync"] = CpuCosts()
    found = medians("kvstore_bench.csv")
    worker_update = update["mxnet-p3"]
    cpu = fit_pair(lambda costs, m: ring_seconds(ring.Horovod(costs, worker_update, update_on="workers-cpu"), m),
                   {m: found[(m, "horovod")] for m in FIT_MODELS})
    return Fitted(transport, update, ring.Horovod(cpu, worker_update, update_on="workers-cpu"))


def system(name: str, found: Fitted | None = None, optimizer: str = "none", update_on: str | None = None,
           link_costs: CpuCosts | None = None) -> PSSystem:
    """The named system with its fitted CPU costs (`found`, else fitted()); with an optimizer (not "none") also
    its update where the system runs it (`update_on` overrides: "workers-cpu" for runs before GPU-side updates;
    "workers-gpu" costs the virtual GPU's memory traffic, not CPU)."""
    found = fitted() if found is None else found
    measured = MEASURED_AS[name]
    base = with_aggregate(SYSTEMS[name])
    place = update_on or base.update_on
    sgd = optimizer != "none"
    if place == "servers" and base.update_on != "servers":
        if sgd:
            raise ValueError(f"{name} runs its optimizer on the workers, not on the servers")
        place = base.update_on  # nothing to update anyway
    update = found.update[measured] if sgd and place != "workers-gpu" else CpuCosts()
    return dataclasses.replace(base, costs=found.transport[measured], update=update, update_on=place,
                               gpu_accesses=SGD_ACCESSES if sgd and place == "workers-gpu"
                               else base.gpu_accesses if place == "servers" else 0,  # servers: a worker's copy
                               link_costs=link_costs or CpuCosts())


def ddp(optimizer: str = "none", found: Fitted | None = None, link_costs: CpuCosts | None = None) -> ddp_lib.Ddp:
    """DDP over Gloo: Horovod's fitted Gloo CPU per byte (no negotiation), the optimizer's step on the virtual GPU
    (SGD's 5 passes over each parameter; nothing without an optimizer)."""
    found = fitted() if found is None else found
    return ddp_lib.Ddp(CpuCosts(0.0, found.horovod.cpu.per_byte), gpu_accesses=SGD_ACCESSES if optimizer != "none"
                       else 0, link_costs=link_costs or CpuCosts())


def horovod(optimizer: str = "none", found: Fitted | None = None, update_on: str = "workers-gpu",
            link_costs: CpuCosts | None = None) -> ring.Horovod:
    """Horovod's fitted allreduce CPU with its workers' update: SGD's memory traffic on the virtual GPU (or, with
    no optimizer, the copy of the sum into the weight, as cluster_worker does), or the fitted CPU update
    (update_on "workers-cpu"; nothing without an optimizer)."""
    found = fitted() if found is None else found
    sgd = optimizer != "none"
    link_costs = link_costs or CpuCosts()
    if update_on == "workers-gpu":
        return ring.Horovod(found.horovod.cpu, update_on="workers-gpu", gpu_accesses=SGD_ACCESSES if sgd else 2,
                            link_costs=link_costs)
    return ring.Horovod(found.horovod.cpu, found.horovod.update if sgd else CpuCosts(), update_on="workers-cpu",
                        link_costs=link_costs)
