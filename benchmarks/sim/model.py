"""The model profile: per-layer forward/backward seconds and parameter arrays, in forward order.

Built from benchmarks/workloads/shapes/<model>.json with benchmarks/emulation/emulated_compute.py's own functions, so
a simulated
layer takes exactly the time an emulated one does (FLOPs x batch / (GPU peak x the model's calibrated efficiency
x scale), backward 2x).
"""

from __future__ import annotations

import dataclasses
import functools
import math

from benchmarks.emulation import emulated_compute

ITEMSIZE = {"float32": 4, "float16": 2, "float64": 8}
# Compute past the paper, as multiples of the profile's P100 (each model calibrated to its published P100 rate,
# ResNet-50 195 images/s: see benchmarks/workloads/shapes/*.json). Sourced single-GPU
# ResNet-50 v1.5 training throughputs, mixed precision, from NVIDIA's DeepLearningExamples (PyTorch, 21.03
# container, batch 256): V100 16 GB 1,200 img/s, A100 80 GB 2,470 img/s -
# https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/Classification/ConvNets/resnet50v1.5/README.md
# H100: no per-GPU ResNet-50 figure was found; Lambda's analysis says vision models gain "~2x" over A100
# (https://lambdalabs.com/blog/nvidia-h100-gpu-deep-learning-performance-analysis), so h100 = 2 x a100 is a
# rough, unverified position. The ratios mix precisions (the P100 base is FP32-era) and batch sizes (256 there,
# 32 here), and are applied uniformly to every layer and model: read the GPU names as positions on a compute
# speed-up axis, not as predictions for those GPUs.
GPU_SPEEDUP = {"p100": 1.0, "v100": 1200 / 190, "a100": 2470 / 190, "h100": 2 * 2470 / 190}


@dataclasses.dataclass(frozen=True)
class Layer:
    forward_s: float
    backward_s: float
    arrays: tuple[int, ...]  # element count of each parameter array of the layer, forward order
    itemsize: int = 4


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    name: str
    layers: tuple[Layer, ...]
    samples_per_batch: int
    unit: str
    # The emulated GPU's memory bandwidth (dilated like its FLOP/s): a worker-side update's time on the virtual GPU.
    memory_bytes_per_s: float = math.inf

    def memory_seconds(self, elements: int, itemsize: int, accesses: int) -> float:
        """An elementwise kernel making `accesses` passes over the array (emulated_compute.Profile's rule)."""
        return accesses * itemsize * elements / self.memory_bytes_per_s

    @property
    def compute_s(self) -> float:
        return sum(layer.forward_s + layer.backward_s for layer in self.layers)

    @property
    def nbytes(self) -> int:
        return sum(n * layer.itemsize for layer in self.layers for n in layer.arrays)


@functools.cache
def load(model: str, batch_size: int = 32, gpu: str = "p100", scale: float = 1.0,
         efficiency_factor: float = 1.0) -> ModelProfile:
    """`gpu` in GPU_SPEEDUP (v100, a100, h100) scales a P100 by the sourced training-throughput ratio there (not
    the emulator's FP32 peak-FLOPS ratio, 1.7x for a V100); other names use the emulator's table; `scale` is
    --gpu-scale; the efficiency is the model's calibrated one times `efficiency_factor` (the emulated runs' rule)."""
    description = emulated_compute.load_description(model)
    efficiency = emulated_compute.efficiency_of(description, efficiency_factor)
    if gpu == "p100" or (gpu not in GPU_SPEEDUP and gpu in emulated_compute.GPU_PEAK_FLOPS):
        profile = emulated_compute.Profile(gpu, scale, efficiency)
    else:  # memory bandwidth scaled with compute: the same position on the speed-up axis, not a datasheet value
        profile = emulated_compute.Profile("p100", scale * GPU_SPEEDUP[gpu], efficiency)
    params = description["params"]
    layers = []
    for entry in emulated_compute.layers_of(description, batch_size, profile):
        arrays = tuple(math.prod(params[i]["shape"]) for i in entry.params)
        itemsize = ITEMSIZE.get(params[entry.params[0]]["dtype"], 4) if entry.params else 4
        layers.append(Layer(entry.forward_s, entry.backward_s, arrays, itemsize))
    per_sample = description.get("tokens_per_sample", 1)
    return ModelProfile(model, tuple(layers), batch_size * per_sample, description.get("sample_unit", "samples"),
                        profile.bytes_per_second)


def synthetic(layers: list[tuple[float, float, int]], itemsize: int = 4,
              memory_bytes_per_s: float = math.inf) -> ModelProfile:
    """A hand-made profile for tests: (forward_s, backward_s, elements) per layer, one array each."""
    return ModelProfile("synthetic", tuple(Layer(f, b, (n,) if n else (), itemsize) for f, b, n in layers), 1,
                        "samples", memory_bytes_per_s)
