"""One worker of the emulated-cluster benchmark (started by benchmarks/suites/cluster_bench.py through the launcher).

Trains --model through MXNet's kvstore interface: kvstore 'p3' in p3kv jobs, 'dist_sync' in the baselines
(P3_BASELINE=dist_sync, or mxnet-p3: dist_sync with ps-lite's P3 van). Two compute modes:

* ``emulated``: the model's real parameter arrays; every layer's forward/backward is an engine operation that
  takes its profiled time (benchmarks/emulation/emulated_compute.py).
* ``none``: as emulated with zero-time layers: push + pull only.
* ``real``: the real network (benchmarks/workloads/real_models.py) trained with gluon.Trainer (SGD) on synthetic data.

Optimizer (--optimizer sgd, the default): SGD with momentum 0.9 and weight decay 1e-4, where each system runs
it in practice: on the servers for p3kv and dist_sync (kv.set_optimizer: update_on_kvstore; real CPU work, as on
a real parameter-server cluster), on the workers for MXNet's P3 (it refuses server-side updates) and Horovod
(allreduce, then the update). A worker's update runs where a real worker runs it, on its GPU: in emulated compute
an operation on the virtual GPU that takes the update's memory traffic at the GPU's bandwidth (EmulatedModel.update,
benchmarks/emulation/emulated_compute.py), after the summed gradient and before the next forward reads the
weight; no CPU update. In real compute, MXNet's SGD on the host CPU (a Gluon Trainer). The JSON's
`update_placement` says which. --optimizer none: the servers only sum (the pulled sum becomes the weight), the
transport-only comparison; Horovod's sum becomes the weight by a copy on the virtual GPU.

The virtual GPU's timing (benchmarks/emulation/emulated_compute.py): every operation is chained, starting where
the device's work before it ended and no earlier than its inputs from the network arrived, so the engine's
dispatch latency is not device time and no gap is forgiven by the slack (--vgpu-slack-us, default
cpp/src/device_clock.h's 50 µs, for operations without that bookkeeping). Each rank's JSON reports per timed
iteration what a slack forgave (`vgpu_forgiven_us_per_iter`), the idle and absorbed dispatch time, and the
latest completion past its due time (`vgpu_late_max_us`): the emulation's own fidelity monitors.

--system horovod (Horovod's Gloo environment from cluster_bench.py, or from `p3kv.launch --kvstore horovod` as
`fab bench` runs it; no servers): horovod.mxnet's allreduce_ (ring allreduce with tensor fusion) sums every
gradient, priority as for the others, then every worker runs the same SGD (real compute: a Gluon Trainer
without a kvstore).
--split-big-arrays N cuts every array above 10^6 elements into N parts (own keys, consecutive, so p3kv's
round-robin puts them on different servers): with unsliced p3kv, the priority-only ablation that still
spreads big arrays over the servers as MXNet's dist_sync does.

The loop is an ordinary training loop: queue forward, backward and one pushpull per parameter (priority: minus
its layer's forward index), then wait for the forward result (as a metric update would), so communication
overlaps backward and the next forward exactly as in real training. Iteration time is the interval between
consecutive forward completions. Each rank writes <out>.rank<r>.json with its iteration times.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import statistics
import sys
import time

from benchmarks.workloads import worker_output

LOG = logging.getLogger("cluster_worker")
MODES = ("p3kv", "dist_sync", "mxnet-p3", "horovod")
SERVER_UPDATE = ("p3kv", "dist_sync")  # the modes whose servers run the optimizer (the others: the workers)
LEARNING_RATE = 0.01
MOMENTUM = 0.9
WEIGHT_DECAY = 1e-4
BIG_ARRAY = 1_000_000  # MXNet's MXNET_KVSTORE_BIGARRAY_BOUND default


def mode_from_env(system: str | None = None) -> str:
    if system == "horovod":
        if "HOROVOD_RANK" not in os.environ:
            raise SystemExit("--system horovod needs Horovod's Gloo environment (HOROVOD_RANK, ...): "
                             "cluster_bench.py and `python -m p3kv.launch --kvstore horovod` set it")
        return "horovod"
    mode = os.environ.get("P3_BASELINE", "") or "p3kv"
    if mode not in MODES:
        raise SystemExit(f"P3_BASELINE={mode!r} is not one of dist_sync, mxnet-p3 (unset means p3kv)")
    if mode == "mxnet-p3" and os.environ.get("DMLC_PS_VAN_TYPE") != "p3":
        raise SystemExit("mode mxnet-p3 needs DMLC_PS_VAN_TYPE=p3 (the launcher's --kvstore mxnet-p3 sets it)")
    return mode


def create_kvstore(mode: str):
    import mxnet as mx

    if mode == "p3kv":
        import p3kv  # noqa: F401  (registers kvstore 'p3')

        return mx.kv.create("p3")
    return mx.kv.create("dist_sync")


def make_optimizer(mx, num_workers: int):
    return mx.optimizer.SGD(learning_rate=LEARNING_RATE, momentum=MOMENTUM, wd=WEIGHT_DECAY,
                            rescale_grad=1.0 / num_workers)


def optimizer_label(name: str, num_workers: int) -> str:
    if name == "none":
        return "none"
    return f"sgd(lr={LEARNING_RATE},momentum={MOMENTUM},wd={WEIGHT_DECAY},rescale_grad=1/{num_workers})"


def split_big_arrays(description: dict, parts: int, bound: int = BIG_ARRAY) -> dict:
    """The description with every array above `bound` elements cut into `parts` flat arrays, each listed
    where the array was (so consecutive keys) and read/written by the same layer."""
    params, index_of = [], {}
    for i, p in enumerate(description["params"]):
        n = 1
        for d in p["shape"]:
            n *= d
        if n > bound and parts > 1:
            step = -(-n // parts)
            sizes = [min(step, n - k * step) for k in range(parts) if k * step < n]
        else:
            sizes = None
        index_of[i] = []
        for k, size in enumerate(sizes or [None]):
            index_of[i].append(len(params))
            params.append(p if size is None else {**p, "name": f"{p['name']}.part{k}", "shape": [size]})
    layers = [{**layer, "params": [j for i in layer["params"] for j in index_of[i]]}
              for layer in description["layers"]]
    return {**description, "params": params, "layers": layers}


def update_placement(optimizer: str, mode: str, compute: str, profile=None, device: str = "CPU") -> str:
    """Where the optimizer runs, as the result rows say it: `profile` describes the virtual GPU of emulated
    compute, `device` the real one of real compute ("CPU" here; "GPU" under device_worker.py on a GPU host)."""
    if optimizer == "none":
        return "none"
    if mode in SERVER_UPDATE:
        return "servers (CPU)"
    return f"workers ({device})" if compute == "real" else profile.describe_bandwidth()


class EmulatedTraining:
    """`description` and `kvstore` default to the model's shape file and the mode's kvstore (tests pass their
    own: a toy model, MXNet's local kvstore)."""

    def __init__(self, args: argparse.Namespace, mode: str, description: dict | None = None, kvstore=None):
        import mxnet as mx

        from benchmarks.emulation import emulated_compute, thread_cap

        self._emulated_compute = emulated_compute
        if description is None:
            description = emulated_compute.load_description(args.model)
        if args.split_big_arrays > 1:
            description = split_big_arrays(description, args.split_big_arrays)
        # compute "none": the same loop with zero-time layers (push + pull only).
        scale = math.inf if args.compute == "none" else args.gpu_scale
        profile = emulated_compute.Profile(args.gpu, scale, emulated_compute.efficiency_of(description,
                                                                                           args.efficiency_factor))
        # The workers' update (MXNet's P3, Horovod): on the virtual GPU, never on the host CPU.
        self.update_on_gpu = args.optimizer == "sgd" and mode not in SERVER_UPDATE
        # Who writes the weights the forward reads: the virtual GPU (its update, or Horovod's sum copied in) or
        # the kvstore (pulled over the network).
        self.model = emulated_compute.EmulatedModel(description, args.batch_size, profile, args.vgpu_slack_us,
                                                    weights_from_device=self.update_on_gpu or mode == "horovod")
        with thread_cap.gpu_side():  # the timer thread is the GPU: never capped as a CPU (thread_cap.py)
            timer_tid = self.model.timer_tid  # the thread starts here
        self.vgpu_timer = emulated_compute.run_timer_as_gpu(timer_tid)
        self.samples = args.batch_size * int(description.get("tokens_per_sample", 1))
        self.unit = description.get("sample_unit", "images")
        self.compute_s = self.model.compute_seconds
        self.mode = mode
        self.update_s = self.model.update_seconds_total if self.update_on_gpu else 0.0
        self.update_placement = update_placement(args.optimizer, mode, args.compute, profile)
        weights = self.model.weights
        if mode == "horovod":
            import horovod.mxnet as hvd

            self.hvd = hvd
            with thread_cap.gpu_side():  # its background thread sums with Gloo here, with NCCL on a GPU host
                hvd.init()
            self.rank, self.num_workers = hvd.rank(), hvd.size()
            for key, weight in enumerate(weights):
                hvd.broadcast_(weight, root_rank=0, name=f"init{key}")
        else:
            self.kv = kvstore if kvstore is not None else create_kvstore(mode)
            for key, weight in enumerate(weights):  # increasing order: P3StoreDist assigns keys so
                self.kv.init(key, weight)
            self.rank, self.num_workers = self.kv.rank, self.kv.num_workers
        if args.optimizer == "sgd" and mode in SERVER_UPDATE:
            self.kv.set_optimizer(make_optimizer(mx, self.num_workers))  # update_on_kvstore: the servers run it
        self.update_on = "none" if args.optimizer == "none" else (
            "servers" if mode in SERVER_UPDATE else "workers")
        mx.nd.waitall()

    def _sync(self, key: int, grad, weight, priority: int) -> None:
        if self.mode == "horovod":
            self.hvd.allreduce_(grad, average=False, name=str(key), priority=priority)
            if not self.update_on_gpu:  # the sum becomes the weight: a copy on the GPU
                self.model.update(key, self._emulated_compute.COPY_ACCESSES)
        elif not self.update_on_gpu:  # servers update (or only sum): the pulled value is the new weight
            self.kv.pushpull(key, grad, out=weight, priority=priority)
        else:
            self.kv.pushpull(key, grad, out=grad, priority=priority)
        if self.update_on_gpu:
            self.model.update(key)

    def device_stats(self, reset: bool = False) -> dict | None:
        return self.model.device_stats(reset)

    def step(self):
        loss = self.model.forward()
        self.model.backward()
        grads, weights = self.model.grads, self.model.weights
        for key in reversed(range(len(grads))):
            self._sync(key, grads[key], weights[key], self.model.priority(key))
        return loss

    def close(self) -> None:
        if self.mode == "horovod":
            import mxnet as mx

            self.hvd.allreduce(mx.nd.zeros(1), name="barrier").wait_to_read()
            self.hvd.shutdown()


class RealTraining:
    def __init__(self, args: argparse.Namespace, mode: str):
        import mxnet as mx
        from mxnet import autograd, gluon

        from benchmarks.workloads import real_models

        self.mx, self.autograd = mx, autograd
        self.model = real_models.build(args.model, args.batch_size, mx.cpu())
        self.batch = self.model.batch()
        self.samples = self.model.samples_per_batch
        self.unit = "tokens" if args.model == "sockeye" else "images"
        self.compute_s = self._compute_only_seconds()
        if args.optimizer == "none":
            raise SystemExit("--compute real trains with SGD; --optimizer none applies to emulated compute only")
        sgd = {"learning_rate": LEARNING_RATE, "momentum": MOMENTUM, "wd": WEIGHT_DECAY}
        params = self.model.net.collect_params()
        self.hvd = None
        self.rank = self.num_workers = -1
        if mode == "horovod":
            import horovod.mxnet as hvd

            hvd.init()
            hvd.broadcast_parameters(params, root_rank=0)
            self.hvd, self.rank, self.num_workers = hvd, hvd.rank(), hvd.size()
            # Gradients summed by allreduce (not averaged), then the same SGD on every worker: the arithmetic of
            # the servers' update, so every system does the same work. Forward order: first layers first.
            self.grads = [p for p in params.values() if p.grad_req != "null"]
            self.trainer = gluon.Trainer(params, "sgd", sgd, kvstore=None)
        else:
            kvstore = "p3" if mode == "p3kv" else "dist_sync"
            if mode == "p3kv":
                import p3kv  # noqa: F401
            # MXNet's P3 port needs the update on the workers (DESIGN.md); the others update on the servers.
            self.trainer = gluon.Trainer(params, "sgd", sgd, kvstore=kvstore, update_on_kvstore=mode != "mxnet-p3")
        self.update_on = "servers" if mode in SERVER_UPDATE else "workers"
        device = "GPU" if self.batch[0].context.device_type == "gpu" else "CPU"
        self.update_placement = update_placement(args.optimizer, mode, args.compute, device=device)
        self.update_s = 0.0  # real work: inside the measured iteration, not modelled
        self.vgpu_timer = None  # no virtual GPU
        self.batch_size = args.batch_size

    def _compute_only_seconds(self) -> float:
        """Forward + backward without communication (second of two runs), the compute part of the bound."""
        seconds = 0.0
        for _ in range(2):
            start = time.perf_counter()
            with self.autograd.record():
                loss = self.model.loss(*self.batch)
            loss.backward()
            self.mx.nd.waitall()
            seconds = time.perf_counter() - start
        return seconds

    def step(self):
        with self.autograd.record():
            loss = self.model.loss(*self.batch)
        loss.backward()
        if self.hvd is not None:
            for i, param in enumerate(self.grads):
                self.hvd.allreduce_(param.grad(), average=False, name=param.name, priority=-i)
        self.trainer.step(self.batch_size)
        if self.rank < 0:  # Gluon's Trainer creates its kvstore in the first step
            self.rank, self.num_workers = self.trainer._kvstore.rank, self.trainer._kvstore.num_workers
        return loss

    def device_stats(self, reset: bool = False) -> dict | None:
        return None  # no virtual GPU

    def close(self) -> None:
        if self.hvd is not None:
            self.hvd.allreduce(self.mx.nd.zeros(1), name="barrier").wait_to_read()
            self.hvd.shutdown()


DEVICE_FIELDS = ("vgpu_slack_us", "vgpu_forgiven_us_per_iter", "vgpu_forgiven_gaps_per_iter", "vgpu_idle_us_per_iter",
                 "vgpu_dispatch_absorbed_us_per_iter", "vgpu_dispatch_max_us", "vgpu_late_max_us",
                 "vgpu_late_us_per_iter", "vgpu_completion_late_max_us", "vgpu_callback_max_us")


def device_fields(stats: dict | None, iterations: int) -> dict:
    """The virtual GPU's fidelity fields of a rank's JSON (None without one), per timed iteration: the gaps the
    slack forgave (µs and count; 0 where every operation is chained, as EmulatedModel's are), the device's idle
    time (waiting for the network), the engine's dispatch latency absorbed by chaining and its largest single
    value; and how late completions ran (a late completion releases its gradient late): vgpu_late_max_us, the
    timer thread waking late (the virtual GPU's own fidelity), and vgpu_late_us_per_iter, those wake-ups' lateness
    summed per timed iteration (what they can have added to an iteration), vgpu_completion_late_max_us, any
    completion past its due time, which adds the engine's completion callbacks holding back the ones behind them
    (their longest: vgpu_callback_max_us), and vgpu_dispatch_max_us, the engine dispatching an operation late (the
    host's CPU behind the GPU): the last two measure the host's CPU, not the GPU."""
    if stats is None or not iterations:
        return dict.fromkeys(DEVICE_FIELDS)
    return {"vgpu_slack_us": stats["slack_us"],
            "vgpu_forgiven_us_per_iter": round(stats["forgiven_us"] / iterations, 1),
            "vgpu_forgiven_gaps_per_iter": round(stats["forgiven_gaps"] / iterations, 2),
            "vgpu_idle_us_per_iter": round(stats["idle_us"] / iterations, 1),
            "vgpu_dispatch_absorbed_us_per_iter": round(stats["dispatch_absorbed_us"] / iterations, 1),
            "vgpu_dispatch_max_us": round(stats["dispatch_max_us"], 1),
            "vgpu_late_max_us": round(stats["wake_late_max_us"], 1),
            "vgpu_late_us_per_iter": round(stats.get("wake_late_total_us", 0.0) / iterations, 1),
            "vgpu_completion_late_max_us": round(stats["late_max_us"], 1),
            "vgpu_callback_max_us": round(stats["callback_max_us"], 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--compute", choices=("emulated", "real", "none"), default="emulated")
    parser.add_argument("--batch-size", type=int, default=32)
    worker_output.add_iteration_arguments(parser, warmup=3, iters=20)
    parser.add_argument("--gpu", default="p100")
    parser.add_argument("--gpu-scale", type=float, default=1.0)
    parser.add_argument("--efficiency-factor", type=float, default=1.0,
                        help="multiplies the model's calibrated efficiency (the sensitivity sweep)")
    parser.add_argument("--optimizer", choices=("sgd", "none"), default="sgd")
    parser.add_argument("--system", choices=("auto", "horovod"), default="auto",
                        help="auto: p3kv or the baseline the launcher set (P3_BASELINE); horovod: Gloo ranks")
    parser.add_argument("--split-big-arrays", type=int, default=0, metavar="N",
                        help="cut arrays above 10^6 elements into N keys (the fair priority-only ablation)")
    parser.add_argument("--vgpu-slack-us", type=float, default=None,
                        help="the virtual GPU's dispatch slack in microseconds (default: cpp/src/device_clock.h's)")
    parser.add_argument("--log-interval", type=int, default=5)
    worker_output.add_out_argument(parser, per_rank=True)
    args = parser.parse_args(argv)
    worker_output.start_logging(rank_lines=True)
    mode = mode_from_env(args.system if args.system != "auto" else None)
    start = time.perf_counter()
    training = (RealTraining if args.compute == "real" else EmulatedTraining)(args, mode)
    import mxnet as mx

    worker_output.mark_ready()  # start-up done: per-thread caps may begin (thread_cap.py)
    times: list[float] = []
    last = None
    rank = num_workers = -1
    for it in range(args.warmup + args.iters):
        training.step().wait_to_read()
        if it == 0:
            rank, num_workers = training.rank, training.num_workers
            LOG.info("rank %d/%d %s %s %s batch %d: first iteration after %.1f s; compute %.3f s/iter; update: "
                     "%s, %.4f s/iter", rank, num_workers, mode, args.model, args.compute, args.batch_size,
                     time.perf_counter() - start, training.compute_s, training.update_placement, training.update_s)
        now = time.perf_counter()
        if last is not None and it >= args.warmup:
            times.append(now - last)
        last = now
        worker_output.mark_progress()  # the runner stops a job whose iterations stall (job_watch.py)
        if it == max(args.warmup - 1, 0):
            training.device_stats(reset=True)  # the virtual GPU's accounting covers the timed iterations
        if times and len(times) % args.log_interval == 0:
            recent = times[-args.log_interval:]
            LOG.info("rank %d iter %d: %.1f %s/s (%.3f s/iter over the last %d)", rank, it + 1,
                     training.samples / statistics.median(recent), training.unit, statistics.median(recent),
                     len(recent))
    device = training.device_stats()
    mx.nd.waitall()
    training.close()
    result = {"rank": rank, "num_workers": num_workers, "mode": mode, "model": args.model,
              "optimizer": optimizer_label(args.optimizer, num_workers), "update_on": training.update_on,
              "update_placement": training.update_placement, "update_s": training.update_s,
              "vgpu_timer": training.vgpu_timer,
              **device_fields(device, len(times)),
              "compute": args.compute, "batch_size": args.batch_size, "samples_per_batch": training.samples,
              "unit": training.unit, "compute_s": training.compute_s, "iter_s": times,
              "median_s": statistics.median(times) if times else None,
              "versions": worker_output.versions("mxnet", "p3kv", "gluoncv", "sockeye", "numpy", "horovod")}
    worker_output.write_rank(args.out, rank, result)
    LOG.info("rank %d: median %.4f s/iter, %.1f %s/s", rank, result["median_s"] or 0,
             training.samples / result["median_s"] if result["median_s"] else 0, training.unit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
