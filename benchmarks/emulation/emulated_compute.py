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
"""

from __future__ import annotations

import dataclasses
import pathlib

from benchmarks.paths import SHAPES_DIR
from benchmarks.workloads import model_shapes

GPU_PEAK_FLOPS = {"p100": 9.3e12, "v100": 15.7e12, "k80": 4.37e12, "t4": 8.1e12}  # fp32, vendor datasheets
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

    def __init__(self, description: dict, batch_size: int, profile: Profile):
        import mxnet as mx

        from p3kv import _p3

        self._mx = mx
        self._bridge = _p3.EngineBridge.load(mx.libinfo.find_lib_path()[0])
        self.layers = layers_of(description, batch_size, profile)
        params = description["params"]
        self.weights = [mx.nd.zeros(p["shape"], dtype=p["dtype"]) for p in params]
        self.grads = [mx.nd.zeros(p["shape"], dtype=p["dtype"]) for p in params]
        self.layer_of = {i: k for k, layer in enumerate(self.layers) for i in layer.params}
        if sorted(self.layer_of) != list(range(len(params))):
            raise SystemExit(f"{description['model']}: the layers do not cover every parameter exactly once")
        # One-element tokens stand for the activations and their gradients: they carry the dependencies.
        self._acts = [mx.nd.zeros((1,)) for _ in self.layers]
        self._act_grads = [mx.nd.zeros((1,)) for _ in self.layers]

    @property
    def compute_seconds(self) -> float:
        """Forward + backward time of one iteration on the virtual device."""
        return sum(layer.forward_s + layer.backward_s for layer in self.layers)

    def priority(self, index: int) -> int:
        return -self.layer_of[index]

    def _op(self, reads: list, writes: list, seconds: float) -> None:
        self._bridge.emulate_compute([a.handle.value for a in reads], [a.handle.value for a in writes], seconds)

    def forward(self):
        """Queues the forward pass; returns the array that is ready when it is done (the "loss")."""
        for k, layer in enumerate(self.layers):
            reads = [self.weights[i] for i in layer.params] + ([self._acts[k - 1]] if k else [])
            self._op(reads, [self._acts[k]], layer.forward_s)
        return self._acts[-1]

    def backward(self) -> None:
        """Queues the backward pass, last layer first; layer k's gradients are ready when its op completes."""
        last = len(self.layers) - 1
        for k in range(last, -1, -1):
            layer = self.layers[k]
            reads = [self._acts[k], *(self.weights[i] for i in layer.params)]
            if k < last:
                reads.append(self._act_grads[k + 1])
            self._op(reads, [self._act_grads[k], *(self.grads[i] for i in layer.params)], layer.backward_s)
