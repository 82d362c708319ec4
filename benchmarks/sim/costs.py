"""CPU constants, fitted on loopback measurements: benchmarks/results/kvstore_bench.csv and transport.csv.

Both benchmarks run 2 workers + 2 servers of each system (Horovod: 2 ranks) on loopback (no bandwidth limit, no
compute) on this 2-core machine, pushing and receiving every parameter array of ResNet-50 and VGG-19 per
iteration through MXNet's engine. Nothing but CPU limits them, so the simulator, run on the same setup (the
processes' hosts sharing 2 cores, unlimited links), must reproduce their s/iter; the two models give two
equations for two unknowns (core-seconds per message or part, per byte), fitted in three steps:

1. Transport, without an optimizer: p3kv on kvstore_bench's `p3-noopt` (its servers only sum), MXNet's
   dist_sync and P3 on transport.csv (no optimizer there).
2. The optimizer's update (SGD with momentum), the transport held: p3kv and dist_sync on their servers,
   MXNet's P3 on its workers, each on its kvstore_bench row with SGD.
3. Horovod's allreduce CPU (per tensor, per byte), its workers' update taken from MXNet's P3 (the same MXNet
   updater on the workers).

They are then used unchanged on the emulated-cluster measurements, which therefore validate them. No constant
here is a guess.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import multiprocessing
import pathlib
import statistics
from collections.abc import Callable

from benchmarks.sim import model as model_lib
from benchmarks.sim import ring
from benchmarks.sim.cluster import Cluster, CpuCosts
from benchmarks.sim.ps import SYSTEMS, PSSystem, simulate

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "results"
TRANSPORT_CPUS = 2  # the cpus column of both benchmarks
FIT_MODELS = ("resnet50_v1", "vgg19")
# Which fitted system stands for each simulated one (the ablations are p3kv with other settings).
MEASURED_AS = {"p3": "p3", "p3-slicing-only": "p3", "p3-priority-only": "p3", "p3-priority-split": "p3",
               "dist_sync": "dist_sync", "mxnet-p3": "mxnet-p3"}
# Step 1's source per system: (file, its system name there).
TRANSPORT_SOURCE = {"p3": ("kvstore_bench.csv", "p3-noopt"), "dist_sync": ("transport.csv", "dist_sync"),
                    "mxnet-p3": ("transport.csv", "mxnet-p3")}


def transport_medians(path: pathlib.Path = RESULTS / "transport.csv") -> dict[tuple[str, str], float]:
    """(model, kvstore) -> median over repeats of the run medians (s/iter)."""
    runs: dict[tuple[str, str], list[float]] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["status"] == "ok":
                runs.setdefault((row["model"], row["kvstore"]), []).append(float(row["median_s"]))
    return {k: statistics.median(v) for k, v in runs.items()}


def kvstore_medians(path: pathlib.Path = RESULTS / "kvstore_bench.csv") -> dict[tuple[str, str], float]:
    """(model, system) -> median s/iter over every timed iteration of every repeat (one row per iteration)."""
    times: dict[tuple[str, str], list[float]] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["status"] == "ok":
                times.setdefault((row["model"], row["system"]), []).append(float(row["time_s"]))
    return {k: statistics.median(v) for k, v in times.items()}


def medians(source: str) -> dict[tuple[str, str], float]:
    path = RESULTS / source
    return kvstore_medians(path) if source == "kvstore_bench.csv" else transport_medians(path)


def no_compute(profile: model_lib.ModelProfile) -> model_lib.ModelProfile:
    layers = tuple(model_lib.Layer(0.0, 0.0, layer.arrays, layer.itemsize) for layer in profile.layers)
    return model_lib.ModelProfile(profile.name, layers, profile.samples_per_batch, profile.unit)


TRANSPORT_CLUSTER = Cluster(hosts=4, rate_bps=None, layout="separate", shared_cores=TRANSPORT_CPUS)
RING_CLUSTER = Cluster(hosts=2, rate_bps=None, shared_cores=TRANSPORT_CPUS)  # kvstore_bench's 2 Horovod ranks


def transport_seconds(system: PSSystem, model: str) -> float:
    return simulate(no_compute(model_lib.load(model)), TRANSPORT_CLUSTER, system, iters=3).iteration_s


def ring_seconds(horovod: ring.Horovod, model: str) -> float:
    return ring.iteration_seconds(no_compute(model_lib.load(model)), RING_CLUSTER, horovod=horovod)


def fit(system: PSSystem, measured: dict[str, float], rounds: int = 6) -> CpuCosts:
    """The transport costs of `system` that reproduce `measured` (model -> s/iter)."""
    return fit_pair(lambda costs, m: transport_seconds(system.with_costs(costs), m), measured, rounds)


def fit_pair(seconds: Callable[[CpuCosts, str], float], measured: dict[str, float], rounds: int = 6) -> CpuCosts:
    """Newton's method on the two unknowns of a CpuCosts (log scale keeps them positive) so that
    seconds(costs, model) matches measured[model] for the FIT_MODELS; the simulated time is close to linear in
    them, so a few rounds suffice."""
    x = [math.log(20e-6), math.log(1e-9)]  # start: 20 us per message, 1 ns per byte

    def residuals(v: list[float]) -> list[float]:
        costs = CpuCosts(math.exp(v[0]), math.exp(v[1]))
        return [math.log(seconds(costs, m) / measured[m]) for m in FIT_MODELS]

    for _ in range(rounds):
        r = residuals(x)
        if max(abs(e) for e in r) < 0.005:
            break
        h = 0.05
        jac = []
        for j in range(2):
            y = list(x)
            y[j] += h
            jac.append([(a - b) / h for a, b in zip(residuals(y), r)])
        # Solve J d = -r for the 2x2 system (columns are jac[0], jac[1]).
        a, c = jac[0]
        b, d = jac[1]
        det = a * d - b * c
        if abs(det) < 1e-12:  # one unknown does not matter: move the per-byte cost only
            x[1] -= r[1] / d if d else 0.0
            continue
        dx0 = (-r[0] * d + b * r[1]) / det
        dx1 = (-a * r[1] + c * r[0]) / det
        x = [x[0] + max(-2.0, min(2.0, dx0)), x[1] + max(-2.0, min(2.0, dx1))]
    return CpuCosts(math.exp(x[0]), math.exp(x[1]))


def _fit_transport(kv: str) -> CpuCosts:
    source, name = TRANSPORT_SOURCE[kv]
    found = medians(source)
    return fit(SYSTEMS[kv], {m: found[(m, name)] for m in FIT_MODELS})


def _fit_update(kv_and_transport: tuple[str, CpuCosts]) -> CpuCosts:
    kv, transport = kv_and_transport
    base = SYSTEMS[kv].with_costs(transport)
    found = kvstore_medians()
    return fit_pair(lambda costs, m: transport_seconds(dataclasses.replace(base, update=costs), m),
                    {m: found[(m, kv)] for m in FIT_MODELS})


@dataclasses.dataclass(frozen=True)
class Fitted:
    transport: dict[str, CpuCosts]  # p3, dist_sync, mxnet-p3: per message, per byte (no optimizer)
    update: dict[str, CpuCosts]  # the same systems' SGD update: per part, per byte
    horovod: ring.Horovod  # Horovod's allreduce CPU and its workers' update


@functools.cache
def fitted(processes: int = 2) -> Fitted:
    """Every fitted constant (the module doc's steps 1-3); the fits of one step run in parallel."""
    kvs = sorted(TRANSPORT_SOURCE)
    with multiprocessing.Pool(processes) as pool:
        transport = dict(zip(kvs, pool.map(_fit_transport, kvs, chunksize=1)))
        update = dict(zip(kvs, pool.map(_fit_update, [(kv, transport[kv]) for kv in kvs], chunksize=1)))
    found = kvstore_medians()
    worker_update = update["mxnet-p3"]
    cpu = fit_pair(lambda costs, m: ring_seconds(ring.Horovod(costs, worker_update), m),
                   {m: found[(m, "horovod")] for m in FIT_MODELS})
    return Fitted(transport, update, ring.Horovod(cpu, worker_update))


def measured_costs() -> dict[str, CpuCosts]:
    """The transport's fitted CpuCosts per measured kvstore (p3, dist_sync, mxnet-p3)."""
    return fitted().transport


def system(name: str, costs: dict[str, CpuCosts] | None = None, optimizer: str = "none") -> PSSystem:
    """The named system with its measured CPU costs (or the given table's); with an optimizer (not "none") also
    the fitted cost of its update, on its servers or its workers as the system runs it."""
    table = measured_costs() if costs is None else costs
    measured = MEASURED_AS[name]
    update = fitted().update[measured] if optimizer != "none" else CpuCosts()
    return SYSTEMS[name].with_costs(table[measured], update)


def horovod(optimizer: str = "none") -> ring.Horovod:
    """Horovod's fitted allreduce CPU, with its workers' update unless `optimizer` is "none"."""
    found = fitted().horovod
    return found if optimizer != "none" else ring.Horovod(found.cpu)
