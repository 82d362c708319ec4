"""Emulated compute: a model's real parameter arrays and layer order, with every layer's forward and backward
replaced by an MXNet engine operation that only takes time.

Why: the paper's cluster had P100 GPUs and 10-30 Gbit links; this machine has 2 CPU cores. Running the real
model here makes compute 100x slower than a GPU, so communication never matters. An emulated layer is an engine
operation (p3kv's EngineBridge.emulate_compute) that reads the layer's weights and input activation, writes its
output (forward) or its gradients (backward), and completes after the layer's profiled time on a virtual
device that runs one operation at a time, like a GPU stream. It costs no CPU. Because it is an ordinary engine
operation on the real arrays, the engine orders it with the kvstore's pushes exactly as real kernels: backward
of layer k releases its gradients to the push, and the next forward of layer k waits until the new weights of
layer k have arrived. That ordering is what P3 exploits.

The profile: forward time of a layer = its forward FLOPs (from benchmarks/workloads/shapes/<model>.json, counted at
batch 1 by make_shapes.py) x batch / (GPU peak FLOP/s x efficiency x scale); backward takes BACKWARD_FACTOR
times its forward. The efficiency is per model: each shape file's "calibration" cites a published P100
training throughput (fp32, batch 32 where published) and the efficiency that reproduces it here
(`calibrated_efficiency`); it can exceed 1 where cuDNN's Winograd/FFT convolutions need fewer FLOPs than the
direct count (VGG). A file without one falls back to EFFICIENCY. `scale` dilates time: a P100 at scale 0.1 on
1 Gbit links has the compute/network ratio of real P100s on 10 Gbit links.

The optimizer, where a system runs it on the workers (MXNet's P3, Horovod): on a GPU the update is one
elementwise kernel per parameter, bound by memory traffic, not FLOPs. SGD with momentum and weight decay
(MXNet's sgd_mom_update, one fused kernel) reads the weight, the gradient and the momentum and writes the weight
and the momentum: SGD_MOMENTUM_ACCESSES = 5 accesses of the parameter's element size (20 bytes per float32
element; rescale_grad, wd and lr are scalars of the same kernel). Its time is those bytes at the GPU's memory
bandwidth (GPU_MEMORY_BANDWIDTH, the datasheet peak, so an optimistic ~0.7 ms for ResNet-50's 25.6M parameters
on a P100), dilated by `scale` like compute. `EmulatedModel.update` queues it on the same virtual device, after
the summed gradient and before the next forward of that layer, as the real kernel would run; the servers' updates
of p3kv and dist_sync stay real CPU work, as on a real parameter-server cluster.

Dispatch latency (cpp/src/device_clock.h, cpp/mxnet/emulated_compute.h): an operation reaches the virtual device
only after the engine has dispatched it, tens of µs after the completion that released it (more on a busy
machine); a real GPU has the next kernel queued long before. So every operation here is "chained": it starts
where the work before it ended, however late the engine dispatched it, and no earlier than its inputs from off the
device arrived (the weights a kvstore pulled, the summed gradient an update reads): a zero-time marker operation
records when those became readable. An input that arrived while the device was busy costs nothing; one that
arrived late costs its lateness, as on a real GPU. No gap is forgiven by a slack (the slack, 50 µs, remains for
operations pushed without this bookkeeping). `EmulatedModel.device_stats` reports the dispatch latency absorbed,
the idle time, and how late completions ran.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import pathlib
import time

from benchmarks.emulation import thread_cap
from benchmarks.paths import SHAPES_DIR
from benchmarks.workloads import model_shapes

GPU_PEAK_FLOPS = {"p100": 9.3e12, "v100": 15.7e12, "k80": 4.37e12, "t4": 8.1e12}  # fp32, vendor datasheets
# Memory bandwidth, bytes/s, the same datasheets: NVIDIA Tesla P100 (PCIe 16 GB, the 9.3 TFLOP/s part above, and
# SXM2): 732 GB/s HBM2; V100 SXM2 900 GB/s; K80 480 GB/s per board of two GPUs (240 per GPU, as its FLOP/s above);
# T4 320 GB/s.
GPU_MEMORY_BANDWIDTH = {"p100": 732e9, "v100": 900e9, "k80": 240e9, "t4": 320e9}
# Memory accesses per element of SGD with momentum and weight decay: read weight, gradient, momentum; write weight,
# momentum (one fused kernel). A plain copy (the sum becoming the weight) is 2: read, write.
SGD_MOMENTUM_ACCESSES = 5
COPY_ACCESSES = 2
EFFICIENCY = 0.5  # models without a calibration
BACKWARD_FACTOR = 2.0


def calibrated_efficiency(samples_per_s: float, fwd_flops_per_sample: float, gpu: str = "p100") -> float:
    """The efficiency at which one emulated `gpu` trains `samples_per_s` (forward + backward FLOPs per sample
    over peak FLOP/s)."""
    return samples_per_s * fwd_flops_per_sample * (1 + BACKWARD_FACTOR) / GPU_PEAK_FLOPS[gpu]


def efficiency_of(description: dict, factor: float = 1.0) -> float:
    """The model's calibrated efficiency (EFFICIENCY without a calibration), times `factor` (sensitivity).
    Derived from the published rate and today's FLOP count, so a regenerated shape file stays calibrated."""
    calibration = description.get("calibration")
    if not calibration:
        return EFFICIENCY * factor
    return calibrated_efficiency(calibration["samples_per_s"], description["fwd_flops_total"],
                                 calibration.get("gpu", "p100")) * factor


CPU_CGROUP_V1 = pathlib.Path("/sys/fs/cgroup/cpu")


def run_timer_as_gpu(tid: int, cpu_root: pathlib.Path = CPU_CGROUP_V1, wait_s: float = 2.0) -> str:
    """Lets the virtual GPU's timer thread (`tid`) run as a GPU runs: beside the emulated host's CPU, not on it.

    A host's CPU quota (benchmarks/emulation/cpu_limit.py) stops every thread of its processes once spent for the
    period, the timer thread included, which then completes GPU operations tens of ms late (vgpu_late_max_us);
    a busy machine delays it too. So the thread gets SCHED_FIFO priority 1, which the quota does not stop, and it
    wakes on time: its work per completion is the engine's callback, a few µs. Where the cpu hierarchy is visible
    (not inside `ip netns exec`, which mounts a /sys of its own) it also moves to the hierarchy's root; in the
    emulated cluster it stays in its host's group, whose real-time budget lets it run real-time. A thread born in
    a capped thread's group (thread_cap.py: no real-time budget there) is refused real-time until the runner
    moves it to its host's group: that is waited for, up to `wait_s`. Returns what was done, for the worker's
    result; a step the system refuses is named there, never fatal."""
    done, refused = [], []
    group = _cpu_group(tid)
    try:
        if group not in (None, "/") and (cpu_root / "tasks").exists():
            (cpu_root / "tasks").write_text(str(tid))
            done.append("outside the host's CPU limit")
    except OSError as e:
        refused.append(f"kept in the host's CPU limit ({e.strerror or e})")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(1))
            done.insert(0, "real-time")
            break
        except OSError as e:
            capped = thread_cap.is_thread_group(_cpu_group(tid) or "")
            if e.errno == errno.EPERM and capped and time.monotonic() < deadline:
                time.sleep(0.01)
                continue
            refused.append(f"not real-time ({e.strerror or e})")
            break
    return ", ".join(done + refused) or "ordinary"


def _cpu_group(tid: int) -> str | None:
    """Thread `tid`'s (of this process) group in the cpu hierarchy; None where unknown."""
    try:
        return thread_cap.cpu_group(pathlib.Path(f"/proc/self/task/{tid}/cgroup").read_text())
    except OSError:
        return None


def load_description(model: str, shapes_dir: pathlib.Path = SHAPES_DIR) -> dict:
    return model_shapes.load(model, shapes_dir, layers=True)


@dataclasses.dataclass(frozen=True)
class Profile:
    """How long FLOPs take on the emulated GPU."""

    gpu: str = "p100"
    scale: float = 1.0
    efficiency: float = EFFICIENCY

    def __post_init__(self) -> None:
        if self.gpu not in GPU_PEAK_FLOPS:
            raise ValueError(f"unknown GPU {self.gpu!r}: use one of {', '.join(GPU_PEAK_FLOPS)}")
        if not self.scale > 0:
            raise ValueError(f"GPU scale must be positive (got {self.scale})")
        if not self.efficiency > 0:
            raise ValueError(f"efficiency must be positive (got {self.efficiency})")

    @property
    def flops_per_second(self) -> float:
        return GPU_PEAK_FLOPS[self.gpu] * self.efficiency * self.scale

    def seconds(self, flops: float) -> float:
        return flops / self.flops_per_second

    @property
    def bytes_per_second(self) -> float:
        """The emulated GPU's memory bandwidth, dilated like its FLOP/s."""
        return GPU_MEMORY_BANDWIDTH[self.gpu] * self.scale

    def memory_seconds(self, elements: int, itemsize: int, accesses: int = SGD_MOMENTUM_ACCESSES) -> float:
        """Time of an elementwise kernel that makes `accesses` passes over `elements` of `itemsize` bytes (the
        default: an SGD-with-momentum update), at the emulated GPU's memory bandwidth."""
        return accesses * itemsize * elements / self.bytes_per_second

    def describe_bandwidth(self) -> str:
        """Where a worker-side update runs, as the result rows say it."""
        return f"workers (virtual GPU, {GPU_MEMORY_BANDWIDTH[self.gpu] / 1e9:g} GB/s x {self.scale:g})"


@dataclasses.dataclass(frozen=True)
class Layer:
    name: str
    params: tuple[int, ...]
    forward_s: float
    backward_s: float


def layers_of(description: dict, batch_size: int, profile: Profile) -> list[Layer]:
    """The model's layers in forward order with their emulated times at `batch_size`."""
    return [Layer(entry["name"], tuple(entry["params"]), profile.seconds(entry["fwd_flops"] * batch_size),
                  profile.seconds(entry["fwd_flops"] * batch_size) * BACKWARD_FACTOR)
            for entry in description["layers"]]


class EmulatedModel:
    """The parameter and gradient NDArrays of a model and the emulated forward/backward over them.

    `weights[i]`/`grads[i]` follow the shape file's params order (forward order); `priority(i)` is -layer.
    """

    def __init__(self, description: dict, batch_size: int, profile: Profile, slack_us: float | None = None,
                 weights_from_device: bool = False):
        """`slack_us`: the virtual device's dispatch slack (None: its default). `weights_from_device`: the weights
        are written by this model's own `update` (a worker-side optimizer, or Horovod's sum copied in); else the
        kvstore writes them, and a forward layer waits for their arrival (recorded by a marker)."""
        import mxnet as mx
        import numpy as np

        from p3kv import _p3

        self._mx = mx
        self._bridge = _p3.EngineBridge.load(mx.libinfo.find_lib_path()[0])
        if slack_us is not None:  # else the device's default (cpp/src/device_clock.h)
            self._bridge.set_emulation_slack(slack_us)
        self.profile = profile
        self._weights_from_device = weights_from_device
        self.layers = layers_of(description, batch_size, profile)
        params = description["params"]
        self.weights = [mx.nd.zeros(p["shape"], dtype=p["dtype"]) for p in params]
        self.grads = [mx.nd.zeros(p["shape"], dtype=p["dtype"]) for p in params]
        self._sizes = [(int(np.prod(p["shape"])), np.dtype(p["dtype"]).itemsize) for p in params]
        self.layer_of = {i: k for k, layer in enumerate(self.layers) for i in layer.params}
        if sorted(self.layer_of) != list(range(len(params))):
            raise SystemExit(f"{description['model']}: the layers do not cover every parameter exactly once")
        # One-element tokens stand for the activations and their gradients: they carry the dependencies; and for
        # the arrival of what is written off the device: a layer's pulled weights, a parameter's summed gradient.
        self._acts = [mx.nd.zeros((1,)) for _ in self.layers]
        self._act_grads = [mx.nd.zeros((1,)) for _ in self.layers]
        self._weights_arrived = [mx.nd.zeros((1,)) for _ in self.layers]
        self._grad_arrived = [mx.nd.zeros((1,)) for _ in params]

    @property
    def compute_seconds(self) -> float:
        """Forward + backward time of one iteration on the virtual device."""
        return sum(layer.forward_s + layer.backward_s for layer in self.layers)

    def update_seconds(self, index: int, accesses: int = SGD_MOMENTUM_ACCESSES) -> float:
        """Time of parameter `index`'s update (or of a kernel with `accesses` per element) on the virtual device."""
        return self.profile.memory_seconds(*self._sizes[index], accesses)

    @property
    def update_seconds_total(self) -> float:
        """Every parameter's SGD-with-momentum update of one iteration on the virtual device."""
        return sum(self.update_seconds(i) for i in range(len(self._sizes)))

    def priority(self, index: int) -> int:
        return -self.layer_of[index]

    def update(self, index: int, accesses: int = SGD_MOMENTUM_ACCESSES) -> None:
        """Queues parameter `index`'s update on the virtual device: after the summed gradient is written (it reads
        it), before the next forward of its layer (it writes the weight), on the same stream as the layers, as
        the real kernel. Nothing is computed (the emulated model learns nothing: its data are zeros), so the
        weight keeps its value and the host's CPU does no work; the engine orders everything as for the real
        update. `accesses`: COPY_ACCESSES where the summed gradient only becomes the weight."""
        self._op([self.grads[index]], [self.weights[index]], self.update_seconds(index, accesses),
                 external=[self.grads[index]], arrival=self._grad_arrived[index])

    @property
    def timer_tid(self) -> int:
        """The Linux thread id of the virtual device's timer thread (run_timer_as_gpu)."""
        return self._bridge.emulation_timer_tid()

    def device_stats(self, reset: bool = False) -> dict:
        """The virtual device's accounting since its start or the last reset (EngineBridge.emulation_stats):
        slack_us, forgiven_us / forgiven_gaps (gaps the slack absorbed), idle_us / idle_gaps, started,
        completed, late_max_us (the latest completion past its due time), dispatch_absorbed_us / dispatch_max_us
        (chained operations' dispatch latency, absorbed exactly)."""
        return dict(self._bridge.emulation_stats(reset))

    def _op(self, reads: list, writes: list, seconds: float, external: tuple = (), arrival=None) -> None:
        """A chained operation (cpp/mxnet/emulated_compute.h): it starts where the device's work before it ended,
        and no earlier than `external` (arrays written off the device) arrived, which `arrival` records."""
        self._bridge.emulate_compute([a.handle.value for a in reads], [a.handle.value for a in writes], seconds,
                                     True, [a.handle.value for a in external],
                                     arrival.handle.value if arrival is not None else 0)

    def forward(self):
        """Queues the forward pass; returns the array that is ready when it is done (the "loss")."""
        for k, layer in enumerate(self.layers):
            reads = [self.weights[i] for i in layer.params] + ([self._acts[k - 1]] if k else [])
            weights = [] if self._weights_from_device else [self.weights[i] for i in layer.params]
            self._op(reads, [self._acts[k]], layer.forward_s, external=weights,
                     arrival=self._weights_arrived[k] if weights else None)
        return self._acts[-1]

    def backward(self) -> None:
        """Queues the backward pass, last layer first; layer k's gradients are ready when its op completes. Every
        backward layer is chained: its weights arrived before its forward ran, and the pushes that read its
        gradients last iteration were done before that forward could start."""
        last = len(self.layers) - 1
        for k in range(last, -1, -1):
            layer = self.layers[k]
            reads = [self._acts[k], *(self.weights[i] for i in layer.params)]
            if k < last:
                reads.append(self._act_grads[k + 1])
            self._op(reads, [self._act_grads[k], *(self.grads[i] for i in layer.params)], layer.backward_s)
