"""CPU constants, fitted on measurements: benchmarks/results/transport.csv.

That benchmark runs 2 workers + 2 servers of each system on loopback (no bandwidth limit, no compute) on this
2-core machine, pushing and receiving every parameter array of ResNet-50 and VGG-19 per iteration. Nothing but
CPU limits it, so the simulator, run on the same setup (4 processes' hosts sharing 2 cores, unlimited links),
must reproduce its s/iter; the two models give two equations for the two unknowns of each system (core-seconds
per message, per byte). They are fitted on the transport runs only and then used unchanged on the cluster
measurements, which therefore validate them. No constant here is a guess.
"""

from __future__ import annotations

import csv
import functools
import multiprocessing
import pathlib
import statistics

from benchmarks.sim import model as model_lib
from benchmarks.sim.cluster import Cluster, CpuCosts
from benchmarks.sim.ps import SYSTEMS, PSSystem, simulate

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "results"
TRANSPORT_CPUS = 2  # transport.csv's cpus column
FIT_MODELS = ("resnet50_v1", "vgg19")
# Which measured transport row stands for each simulated system (the ablations are p3kv with other settings).
MEASURED_AS = {"p3": "p3", "p3-slicing-only": "p3", "p3-priority-only": "p3", "dist_sync": "dist_sync",
               "mxnet-p3": "mxnet-p3"}


def transport_medians(path: pathlib.Path = RESULTS / "transport.csv") -> dict[tuple[str, str], float]:
    """(model, kvstore) -> median over repeats of the run medians (s/iter)."""
    runs: dict[tuple[str, str], list[float]] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["status"] == "ok":
                runs.setdefault((row["model"], row["kvstore"]), []).append(float(row["median_s"]))
    return {k: statistics.median(v) for k, v in runs.items()}


def no_compute(profile: model_lib.ModelProfile) -> model_lib.ModelProfile:
    layers = tuple(model_lib.Layer(0.0, 0.0, layer.arrays, layer.itemsize) for layer in profile.layers)
    return model_lib.ModelProfile(profile.name, layers, profile.samples_per_batch, profile.unit)


TRANSPORT_CLUSTER = Cluster(hosts=4, rate_bps=None, layout="separate", shared_cores=TRANSPORT_CPUS)


def transport_seconds(system: PSSystem, model: str) -> float:
    return simulate(no_compute(model_lib.load(model)), TRANSPORT_CLUSTER, system, iters=3).iteration_s


def fit(system: PSSystem, measured: dict[str, float], rounds: int = 6) -> CpuCosts:
    """Newton's method on the two unknowns (log scale keeps them positive); the simulated time is close to
    linear in them, so a few rounds suffice."""
    import math

    x = [math.log(20e-6), math.log(1e-9)]  # start: 20 us per message, 1 ns per byte

    def residuals(v: list[float]) -> list[float]:
        costs = CpuCosts(math.exp(v[0]), math.exp(v[1]))
        return [math.log(transport_seconds(system.with_costs(costs), m) / measured[m]) for m in FIT_MODELS]

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


def _fit_kvstore(kv: str) -> CpuCosts:
    medians = transport_medians()
    return fit(SYSTEMS[kv], {m: medians[(m, kv)] for m in FIT_MODELS})


@functools.cache
def measured_costs(processes: int = 2) -> dict[str, CpuCosts]:
    """Fitted CpuCosts per measured kvstore (p3, dist_sync, mxnet-p3); the three fits run in parallel."""
    kvs = sorted(set(MEASURED_AS.values()))
    with multiprocessing.Pool(processes) as pool:
        return dict(zip(kvs, pool.map(_fit_kvstore, kvs, chunksize=1)))


def system(name: str, costs: dict[str, CpuCosts] | None = None) -> PSSystem:
    """The named system with its measured CPU costs (or the given table's)."""
    table = measured_costs() if costs is None else costs
    return SYSTEMS[name].with_costs(table[MEASURED_AS[name]])
