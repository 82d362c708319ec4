"""The paper's evaluation at paper scale (P100 compute, 1-30 Gbps, 2-16 machines) and past it (25/100 Gbps,
V100/A100/H100-class compute) -> results/sim_paper_*.{csv,png}.

Assumptions at paper scale (not measured, stated here and in the CSVs): batch 32 per GPU as the emulated runs;
one worker and one server per machine; 20 us one-way latency (a datacenter top-of-rack hop); hosts' CPUs are
not the bottleneck (`cpu=ideal`: no per-message, per-byte or server-side optimizer CPU cost), except where a
sweep says `measured` (this 2-core machine's loopback-fitted constants, SGD's update included, with 4 cores per
host), which brackets the real answer. Compute is each model's calibrated P100 rate
(benchmarks/workloads/shapes/*.json); the workers' updates of MXNet's P3 and Horovod run on the GPU at its
memory bandwidth (as in the emulation); so do p3kv.torch's (worker placement) and DDP's optimizer step. Each
system runs its tuned setting for the model where results/tuning/best.json has one, else its defaults (settings.py;
the CSVs' `setting` column says which).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import multiprocessing

from benchmarks.sim import costs as costs_lib
from benchmarks.sim import ddp, ring, settings
from benchmarks.sim import model as model_lib
from benchmarks.sim.cluster import Cluster
from benchmarks.sim.ps import SGD_ACCESSES, SYSTEMS, simulate

RESULTS = costs_lib.RESULTS
MODELS = ("resnet50_v1", "inceptionv3", "vgg19", "sockeye")
BANDWIDTHS_GBPS = (1, 2, 4, 6, 10, 15, 20, 25, 30)
LATENCY_S = 20e-6
# What the paper's text reports: P3's best speedup over MXNet (and where), read off section 5.
PAPER = {
    ("bandwidth", "resnet50_v1"): (4, 1.26), ("bandwidth", "inceptionv3"): (None, 1.18),
    ("bandwidth", "vgg19"): (15, 1.66), ("bandwidth", "sockeye"): (None, 1.38),
    ("slicing-only", "vgg19"): (30, 1.49),
    ("scale", "vgg19"): (8, 1.61), ("scale", "sockeye"): (8, 1.18), ("scale", "resnet50_v1"): (None, 1.0),
}


@dataclasses.dataclass(frozen=True)
class Point:
    sweep: str
    model: str
    system: str
    hosts: int = 4
    gbps: float = 10.0
    gpu: str = "p100"
    slice_size: int | None = None
    cpu: str = "ideal"


def run_point(p: Point, loopback: costs_lib.Fitted | None = None) -> dict:
    """One point; `loopback`: the fitted CPU constants for `cpu=measured` points (None: costs.fitted())."""
    profile = model_lib.load(p.model, 32, p.gpu)
    cores = 4 if p.cpu == "measured" else None
    cluster = Cluster(p.hosts, p.gbps * 1e9, latency_s=LATENCY_S, cores=cores)
    chosen, where = settings.tuned_for_model(p.system, p.model)
    env = settings.setting(p.system, chosen)
    if p.system == "horovod":
        horovod = (costs_lib.horovod("sgd", loopback) if p.cpu == "measured"
                   else ring.Horovod(update_on="workers-gpu", gpu_accesses=SGD_ACCESSES))
        result = ring.simulate(profile, cluster, settings.apply_horovod(horovod, env), iters=3)
    elif p.system == "ddp":
        d = costs_lib.ddp("sgd", loopback) if p.cpu == "measured" else ddp.Ddp(gpu_accesses=SGD_ACCESSES)
        result = ddp.simulate(profile, cluster, settings.apply_ddp(d, env), iters=3)
    else:
        system = (costs_lib.system(p.system, loopback, optimizer="sgd") if p.cpu == "measured"
                  else dataclasses.replace(SYSTEMS[p.system], gpu_accesses=SGD_ACCESSES
                                           if SYSTEMS[p.system].update_on == "workers-gpu"
                                           else SYSTEMS[p.system].gpu_accesses))
        result = simulate(profile, cluster, settings.apply_ps(system, env, p.slice_size), iters=3)
    return {**dataclasses.asdict(p), "compute_s": round(profile.compute_s, 4),
            "iteration_s": round(result.iteration_s, 5), "throughput": round(result.throughput, 2),
            "unit": result.unit, "setting": where}


def points(which: str) -> list[Point]:
    pts: list[Point] = []
    if which in ("bandwidth", "all"):
        for m in MODELS:
            systems = ["p3", "dist_sync", "mxnet-p3", "horovod", "torch-p3kv", "ddp"]  # and PyTorch's pair
            if m == "vgg19":
                systems += ["p3-slicing-only", "p3-priority-only"]
            pts += [Point("bandwidth", m, s, gbps=g) for s in systems for g in BANDWIDTHS_GBPS]
    if which in ("scale", "all"):
        pts += [Point("scale", m, s, hosts=h, gbps=10) for m in MODELS for s in ("p3", "dist_sync", "horovod")
                for h in (2, 4, 8, 16)]
    if which in ("slice", "all"):
        pts += [Point("slice", m, "p3", gbps=10, slice_size=z, cpu=c) for m in ("resnet50_v1", "vgg19")
                for z in (5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 1_000_000) for c in ("ideal", "measured")]
    if which in ("future", "all"):
        pts += [Point("future", m, s, gbps=g, gpu=gpu) for m in MODELS for s in ("p3", "dist_sync", "horovod")
                for g in (10, 25, 100) for gpu in ("p100", "v100", "a100", "h100")]
    return pts


def estimated_cost(p: Point) -> float:
    """Roughly the simulation's events: messages per iteration (parts x workers x (1 + workers))."""
    if p.system in ("horovod", "ddp"):
        return 0.0
    profile = model_lib.load(p.model, 32, p.gpu)
    if p.system in ("dist_sync", "p3-priority-only"):
        parts = sum(len(layer.arrays) for layer in profile.layers)
    else:
        parts = profile.nbytes / 4 / (p.slice_size or SYSTEMS[p.system].slice_size)
    return parts * p.hosts * (1 + p.hosts) * (2 if p.cpu == "measured" else 1)


def run(which: str = "all", processes: int = 2, loopback: costs_lib.Fitted | None = None) -> list[dict]:
    pts = points(which)
    if loopback is None and any(p.cpu == "measured" for p in pts):
        loopback = costs_lib.fitted()  # once here, not in every process
    # Two processes: the machine has 2 cores shared with others. Slowest points first for load balance.
    order = sorted(pts, key=lambda p: -estimated_cost(p))
    with multiprocessing.Pool(processes) as pool:
        rows = pool.map(functools.partial(run_point, loopback=loopback), order, chunksize=1)
    by_sweep: dict[str, list[dict]] = {}
    for r in rows:
        by_sweep.setdefault(r["sweep"], []).append(r)
    for sweep, group in by_sweep.items():
        group.sort(key=lambda r: (r["model"], r["system"], r["gpu"], r["hosts"], r["gbps"], r["slice_size"] or 0,
                                  r["cpu"]))
        with open(RESULTS / f"sim_paper_{sweep}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, list(group[0]))
            writer.writeheader()
            writer.writerows(group)
    return rows


def speedups(rows: list[dict], key: str, base: str = "dist_sync") -> dict[tuple, float]:
    """(model, gpu, x) -> p3's throughput over `base`'s, x being the column `key` (gbps or hosts)."""
    t = {(r["model"], r["gpu"], r[key], r["system"]): r["throughput"] for r in rows}
    return {(m, g, x): v / t[(m, g, x, base)] for (m, g, x, s), v in t.items() if s == "p3" and (m, g, x, base) in t}


if __name__ == "__main__":
    multiprocessing.freeze_support()
