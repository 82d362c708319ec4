"""One command for the simulator's experiments:

    python -m benchmarks.sim.run all          # fit, validate, paper-scale sweeps, past the paper
    python -m benchmarks.sim.run validate     # or: fit, bandwidth, scale, slice, future, utilisation
    python -m benchmarks.sim.run fit --refit  # fit again even if results/sim_fit.json matches its inputs

Writes benchmarks/results/sim_*.{csv,png,json} and prints a summary. The fitted constants are kept in
results/sim_fit.json with a hash of their inputs (the loopback CSVs, the fit points, the simulator's source) and
refitted only when those change.
"""

from __future__ import annotations

import argparse
import csv
import logging
import sys
import time

from benchmarks.sim import costs as costs_lib
from benchmarks.sim import model as model_lib
from benchmarks.sim import paper, plots, validate
from benchmarks.sim.cluster import Cluster
from benchmarks.sim.ps import SYSTEMS, simulate

RESULTS = costs_lib.RESULTS


def utilisation_series(busy: dict, host: int, bin_s: float, end: float) -> list[tuple[float, float, float]]:
    """Gbit/s of host's egress and ingress per bin (payload bytes spread over each message's interval)."""
    bins = int(end / bin_s) + 1
    out = {d: [0.0] * bins for d in ("egress", "ingress")}
    for d in out:
        for start, stop, nbytes in busy.get((d, host), []):
            span = max(stop - start, 1e-12)
            b = int(start / bin_s)
            while b < bins and b * bin_s < stop:
                overlap = min(stop, (b + 1) * bin_s) - max(start, b * bin_s)
                out[d][b] += nbytes * 8 * overlap / span / bin_s / 1e9
                b += 1
    return [(i * bin_s, out["egress"][i], out["ingress"][i]) for i in range(bins)]


def run_utilisation() -> None:
    """Sockeye, 4 machines at 10 Gbps, P100 (the paper's utilisation figure): host 0's link over 3 iterations."""
    profile = model_lib.load("sockeye", 32, "p100")
    cluster = Cluster(4, 10e9, latency_s=paper.LATENCY_S)
    series, rows = {}, []
    for name in ("dist_sync", "p3"):
        result = simulate(profile, cluster, SYSTEMS[name], iters=3, record=True)
        end = max(max(t) for t in result.forward_done)
        pts = utilisation_series(result.busy, 0, 0.005, end)
        series[f"{name}: {result.iteration_s:.3f} s/iter"] = pts
        rows += [{"system": name, "time_s": round(t, 4), "egress_gbps": round(e, 3), "ingress_gbps": round(i, 3)}
                 for t, e, i in pts]
    with open(RESULTS / "sim_paper_utilisation.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plots.utilisation(series, RESULTS / "sim_paper_utilisation.png", "Sockeye, 4 x 10 Gbps, P100 (simulated)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("all", "fit", "validate", "bandwidth", "scale", "slice", "future",
                                    "utilisation"))
    p.add_argument("--refit", action="store_true", help="fit the constants again even if results/sim_fit.json "
                   "was fitted on the same inputs")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    start = time.perf_counter()
    loopback = None
    if args.what in ("all", "fit", "validate"):
        points, selection = validate.measured_points()
        found = validate.constants(points, args.refit)
        loopback = found.loopback
        for kv, c in loopback.transport.items():
            u = loopback.update[kv]
            print(f"fitted CPU costs {kv}: {c.per_message * 1e6:.1f} us/message, {c.per_byte * 1e9:.3f} ns/byte; "
                  f"update {u.per_message * 1e6:.1f} us/part, {u.per_byte * 1e9:.3f} ns/byte")
        h = loopback.horovod
        print(f"fitted CPU costs horovod: {h.cpu.per_message * 1e6:.1f} us/tensor, {h.cpu.per_byte * 1e9:.3f} "
              f"ns/byte; update (MXNet P3's) {h.update.per_message * 1e6:.1f} us/tensor, "
              f"{h.update.per_byte * 1e9:.3f} ns/byte")
        print("emulated links' extra CPU (fit split only): " + ", ".join(
            f"{kv} {v * 1e9:.3f} ns/byte" for kv, v in found.links.items()))
        print(f"emulated links' delivered share of their rate (fit split only): {100 * found.link_efficiency:.2f}%")
        print(f"validation rows: {selection}")
    if args.what in ("all", "validate"):
        rows = validate.run()
        plots.validation(rows, RESULTS / "sim_validation.png")
        print(validate.summary(rows))
    sweeps = {"bandwidth": ("gbps", "link Gbps (4 machines)"), "scale": ("hosts", "machines (10 Gbps)")}
    # One pool for all four sweeps (slowest points first), so neither core idles between sweeps.
    names = [n for n in ("bandwidth", "scale", "slice", "future") if args.what in ("all", n)]
    all_rows = paper.run(args.what if len(names) == 1 else "all", loopback=loopback) if names else []
    for name in names:
        rows = [r for r in all_rows if r["sweep"] == name]
        if name in sweeps:
            plots.sweep(rows, sweeps[name][0], name, RESULTS / f"sim_paper_{name}.png", sweeps[name][1])
            for k, v in sorted(paper.speedups(rows, sweeps[name][0]).items()):
                print(f"{name} {k[0]} {k[2]}: p3 / dist_sync {v:.2f}x")
        elif name == "slice":
            plots.slices(rows, RESULTS / "sim_paper_slice.png")
        else:
            plots.future(rows, RESULTS / "sim_paper_future.png")
    if args.what in ("all", "utilisation"):
        run_utilisation()
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
