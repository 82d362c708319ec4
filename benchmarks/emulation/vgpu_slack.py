"""The virtual GPU's dispatch slack, measured without communication: a model's emulated forward and backward (and,
with --update, the workers' SGD update of every parameter, as MXNet's P3 and Horovod run it) at each given slack,
interleaved in one process, with the engine settings of the cluster jobs (one CPU worker thread).

Per slack it reports the median iteration time against the device time the profile asks for (forward + backward
[+ update]), the gaps the slack forgave (µs and count per iteration), the idle time, the engine's dispatch latency
absorbed by chaining, and the latest completion. EmulatedModel's operations are all chained
(benchmarks/emulation/emulated_compute.py), so the slack should change nothing and the excess should be ~0: an
excess is engine latency that still reaches the device's timeline (e.g. an arrival marker dispatched late).

    python -m benchmarks.emulation.vgpu_slack --model resnet50_v1 --gpu-scale 0.2 --slack-us 1000 50 --iters 10
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

LOG = logging.getLogger("vgpu_slack")


def measure(model, iterations: int, update: bool) -> dict:
    """Runs `iterations` timed iterations (after one untimed) of `model`; returns its timings and device stats."""
    import mxnet as mx

    def step():
        loss = model.forward()
        model.backward()
        if update:
            for i in reversed(range(len(model.weights))):
                model.update(i)
        return loss

    step().wait_to_read()
    model.device_stats(reset=True)
    times = []
    last = time.perf_counter()
    for _ in range(iterations):
        step().wait_to_read()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    stats = model.device_stats()
    mx.nd.waitall()
    return {"iter_s": times, "stats": stats}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50_v1")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--gpu", default="p100")
    parser.add_argument("--gpu-scale", type=float, default=1.0)
    parser.add_argument("--slack-us", type=float, nargs="+", default=[1000.0, 50.0])
    parser.add_argument("--update", action="store_true", help="also the workers' update on the virtual GPU")
    parser.add_argument("--weights-from", choices=("kvstore", "device"), default="kvstore",
                        help="kvstore: forward layers get the slack rule, as where a kvstore writes the weights "
                             "(p3kv, dist_sync); device: they are chained, as after the workers' own update")
    parser.add_argument("--iters", type=int, default=10, help="timed iterations per slack and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the slacks, interleaved")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")  # as the cluster jobs run (cluster_job.py)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from benchmarks.emulation import emulated_compute

    description = emulated_compute.load_description(args.model)
    profile = emulated_compute.Profile(args.gpu, args.gpu_scale, emulated_compute.efficiency_of(description))
    models = {s: emulated_compute.EmulatedModel(description, args.batch_size, profile, s,
                                                weights_from_device=args.weights_from == "device")
              for s in args.slack_us}
    runs: dict[float, list[dict]] = {s: [] for s in args.slack_us}
    for _ in range(args.rounds):
        for slack, model in models.items():
            runs[slack].append(measure(model, args.iters, args.update))
    any_model = next(iter(models.values()))
    device_s = any_model.compute_seconds + (any_model.update_seconds_total if args.update else 0.0)
    results = []
    for slack, measured in runs.items():
        times = [t for m in measured for t in m["iter_s"]]
        n = sum(len(m["iter_s"]) for m in measured)
        per_iter = {k: sum(m["stats"][k] for m in measured) / n
                    for k in ("forgiven_us", "forgiven_gaps", "idle_us", "started", "dispatch_absorbed_us")}
        median = statistics.median(times)
        result = {"model": args.model, "batch_size": args.batch_size, "gpu_scale": args.gpu_scale,
                  "update": args.update, "weights_from": args.weights_from, "slack_us": slack, "iterations": n,
                  "median_s": median,
                  "device_s": device_s, "excess_pct": 100 * (median / device_s - 1),
                  "forgiven_us_per_iter": per_iter["forgiven_us"], "forgiven_gaps_per_iter": per_iter["forgiven_gaps"],
                  "idle_us_per_iter": per_iter["idle_us"], "items_per_iter": per_iter["started"],
                  "dispatch_absorbed_us_per_iter": per_iter["dispatch_absorbed_us"],
                  "late_max_us": max(m["stats"]["late_max_us"] for m in measured),
                  "load_1m": os.getloadavg()[0]}
        results.append(result)
        LOG.info("slack %6.0f us: median %.4f s/iter vs device %.4f s (%+.2f%%); forgiven %.0f us in %.0f gaps per "
                 "iteration of %.0f items; idle %.0f us/iter; chained dispatch absorbed %.0f us/iter; latest "
                 "completion %.0f us late", slack, median, device_s, result["excess_pct"],
                 result["forgiven_us_per_iter"], result["forgiven_gaps_per_iter"], result["items_per_iter"],
                 result["idle_us_per_iter"], result["dispatch_absorbed_us_per_iter"], result["late_max_us"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
