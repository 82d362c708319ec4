"""Emulated compute for torch workers: the virtual GPU of emulated_compute.py (the same profile, calibration, layer
times and worker-side update cost) for a torch training loop, whose framework has no engine to hang operations on.

An `EmulatedNet` is an nn.Module with one child module per layer of the model's shape file, holding that layer's
parameters with their real shapes and dtypes (the same arrays the MXNet workers push), so that p3kv.torch's hooks
(forward pre-hooks, post-accumulate-grad hooks) and DDP's bucketed reducer see an ordinary module. Each layer's
forward and backward is a torch.autograd.Function that computes nothing and takes the layer's profiled time on a
`VirtualGpu`, a serial device's timeline kept in host time (time.monotonic):

- forward layers and the optimizer's updates are queued as a real GPU program queues kernels: the host does not
  wait; an operation starts where the device's work before it ends, or when the host issued it if that is later
  (its inputs from off the device, the weights a forward pre-hook waited for or the summed gradient an update
  reads, were in the host's hands then);
- backward layers are chained: every input comes from the device, so a layer starts where the one before it ended
  however late the host issued it (the host's dispatch latency is absorbed, as cpp/src/device_clock.h's
  StartChained does for the MXNet workers), and the host waits until it ends: its gradients are final then, and
  autograd runs the gradient hooks (p3kv's push, DDP's bucket) right after, as a GPU event would release them;
- the training loop waits for the forward pass's end (reading the loss), as the MXNet workers do.

Nothing is computed in timing mode: the gradients are fixed buffers (filled once; autograd takes them without a
copy), a worker-side update only takes its time on the virtual GPU (VirtualGpuSGD, at the GPU's memory bandwidth,
emulated_compute.Profile.memory_seconds), and so does server placement's copy of the servers' new values into the
parameters (copy_weights_on_the_virtual_gpu), and so do the systems' own passes over the gradients during backward
(DDP's bucket copies, p3kv's 1/W scaling: gradient_work.py, which the worker enters around backward), so the hosts'
2 cores are left to what is measured: the communication and the frameworks' own CPU work (gloo's sums, the servers'
sums and SGD, the Python).
With `real=True` (the tests) the gradients depend on the weights the forward read and the updates are torch's own
SGD, so that the final weights show each system did the work.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from torch import nn

from benchmarks.emulation import emulated_compute

DTYPES = {"float32": torch.float32, "float16": torch.float16, "float64": torch.float64}
# real=True: a layer's gradient is base + WEIGHT_COUPLING * weight (base: a per-rank random tensor), so that a stale
# or missing update changes every later gradient, and with it the final weights.
WEIGHT_COUPLING = 0.01


@dataclasses.dataclass
class DeviceStats:
    """What the virtual GPU's timeline saw (microseconds): idle gaps (the device waited for the host or the network),
    the host's dispatch latency absorbed by chained operations, and how late the host woke from its waits."""

    idle_us: float = 0.0
    idle_gaps: int = 0
    dispatch_absorbed_us: float = 0.0
    dispatch_max_us: float = 0.0
    host_late_max_us: float = 0.0
    started: int = 0

    def as_dict(self) -> dict:
        """The keys EmulatedModel.device_stats gives (cluster_worker.device_fields reads them). This timeline is
        computed, not timed: no slack forgives anything and no timer can be late (wake_late_max_us, the rows'
        vgpu_late_max_us, is 0 by construction). What can be late is the host, waking from a wait for the device:
        late_max_us (vgpu_completion_late_max_us), as the MXNet workers report their completions run late by the
        host's CPU; it delays the gradients' release, never the device's timeline."""
        return {"slack_us": 0.0, "forgiven_us": 0.0, "forgiven_gaps": 0, "idle_us": self.idle_us,
                "idle_gaps": self.idle_gaps, "started": self.started, "completed": self.started,
                "late_max_us": self.host_late_max_us, "wake_late_max_us": 0.0, "wake_late_total_us": 0.0,
                "callback_max_us": 0.0, "dispatch_absorbed_us": self.dispatch_absorbed_us,
                "dispatch_max_us": self.dispatch_max_us}


class VirtualGpu:
    """One GPU stream's timeline in host time. Not thread-safe: the training loop's thread (autograd's CPU thread
    is the caller's) is its only user."""

    def __init__(self, clock=time.monotonic, sleep=time.sleep):
        self._clock, self._sleep = clock, sleep
        self.end = 0.0  # when the work queued so far ends
        self._ran = False  # before the first operation there is no gap to account for
        self.stats = DeviceStats()

    def _start(self, start: float, seconds: float) -> float:
        if self._ran and start > self.end:
            self.stats.idle_us += (start - self.end) * 1e6
            self.stats.idle_gaps += 1
        self._ran = True
        self.stats.started += 1
        self.end = start + seconds
        return self.end

    def queue(self, seconds: float) -> float:
        """An operation issued now whose off-device inputs are here: starts at max(end of queued work, now).
        Returns when it ends; the host does not wait."""
        return self._start(max(self.end, self._clock()), seconds)

    def chain(self, seconds: float) -> float:
        """An operation whose inputs all come from the device: starts where the queued work ends (the host's lateness
        in issuing it is absorbed and counted). Returns when it ends; the host does not wait."""
        now = self._clock()
        if not self._ran:
            return self._start(now, seconds)
        if now > self.end:
            late = (now - self.end) * 1e6
            self.stats.dispatch_absorbed_us += late
            self.stats.dispatch_max_us = max(self.stats.dispatch_max_us, late)
        self.stats.started += 1
        self.end += seconds
        return self.end

    def wait(self, until: float | None = None) -> None:
        """Blocks the host until the device reaches `until` (default: the end of all queued work)."""
        until = self.end if until is None else until
        while True:
            left = until - self._clock()
            if left <= 0:
                break
            self._sleep(left)
        late = (self._clock() - until) * 1e6
        self.stats.host_late_max_us = max(self.stats.host_late_max_us, late)

    def reset_stats(self) -> None:
        self.stats = DeviceStats()


class _LayerFunction(torch.autograd.Function):
    """One layer: forward queues its time, backward chains its time, waits for it and hands autograd the layer's
    gradients."""

    @staticmethod
    def forward(ctx, token, layer, *weights):
        ctx.layer = layer
        if layer.real:
            ctx.save_for_backward(*weights)  # the weights this forward read (a late update changes them)
        layer.gpu.queue(layer.forward_s)
        return token.new_zeros(1)

    @staticmethod
    def backward(ctx, grad_token):
        layer = ctx.layer
        end = layer.gpu.chain(layer.backward_s)
        grads = layer.gradients(ctx.saved_tensors if layer.real else ())
        layer.gpu.wait(end)
        return (grad_token, None, *grads)


class EmulatedLayer(nn.Module):
    """A layer of the shape file: its parameters (named after the file's arrays) and its emulated times."""

    def __init__(self, params: list[dict], forward_s: float, backward_s: float, gpu: VirtualGpu, real: bool,
                 generator: torch.Generator):
        super().__init__()
        self.gpu, self.forward_s, self.backward_s, self.real = gpu, forward_s, backward_s, real
        self.names = []
        for p in params:
            name = p["name"].replace(".", "_")
            weight = torch.empty(p["shape"], dtype=DTYPES[p["dtype"]])
            if real:
                weight.normal_(0.0, 0.1, generator=generator)
            else:
                weight.zero_()
            self.register_parameter(name, nn.Parameter(weight))
            self.names.append(name)
        self._grads: list[torch.Tensor] = []

    def weights(self) -> list[torch.Tensor]:
        return [getattr(self, n) for n in self.names]

    def seed_gradients(self, rank: int, generator: torch.Generator) -> None:
        """The fixed part of this layer's gradients on `rank`: random in real mode, a constant in timing mode
        (filling 143 M random values per VGG-19 worker costs seconds of CPU and measures nothing)."""
        self._grads = []
        for w in self.weights():
            g = torch.empty_like(w)
            if self.real:
                g.normal_(0.0, 1.0, generator=generator)
            else:
                g.fill_(1e-3 * (rank + 1))
            self._grads.append(g)

    def gradients(self, saved: tuple) -> list[torch.Tensor]:
        if self.real:
            return [g + WEIGHT_COUPLING * w for g, w in zip(self._grads, saved)]
        # A fresh tensor object on the fixed storage: autograd takes it as .grad without a copy (its only reference).
        return [g.detach() for g in self._grads]

    def forward(self, token):
        return _LayerFunction.apply(token, self, *self.weights())


class EmulatedNet(nn.Module):
    """The model of a shape file (emulated_compute.load_description) at `batch_size` on `profile`'s virtual GPU.
    Its forward takes a one-element token (any tensor) and returns a one-element "loss" whose backward is the
    emulated backward pass."""

    def __init__(self, description: dict, batch_size: int, profile: emulated_compute.Profile, rank: int,
                 real: bool = False, seed: int = 0, gpu: VirtualGpu | None = None):
        super().__init__()
        self.gpu = gpu or VirtualGpu()
        self.profile = profile
        params = description["params"]
        weights_gen = torch.Generator().manual_seed(seed)  # the same initial weights on every rank
        grads_gen = torch.Generator().manual_seed(seed + 1 + rank)  # each rank its own gradients
        layers = emulated_compute.layers_of(description, batch_size, profile)
        self.layers = nn.ModuleList(
            EmulatedLayer([params[i] for i in layer.params], layer.forward_s, layer.backward_s, self.gpu, real,
                          weights_gen) for layer in layers)
        for layer in self.layers:
            layer.seed_gradients(rank, grads_gen)
        self.compute_seconds = sum(layer.forward_s + layer.backward_s for layer in layers)

    def forward(self, token):
        for layer in self.layers:
            token = layer(token)
        return token

    def update_seconds(self, p: torch.Tensor) -> float:
        """SGD with momentum on `p` on the virtual GPU (emulated_compute's cost for the MXNet workers' updates)."""
        return self.profile.memory_seconds(p.numel(), p.element_size())

    def copy_seconds(self, p: torch.Tensor) -> float:
        """A device-to-device copy into `p` on the virtual GPU: one read and one write of it."""
        return self.profile.memory_seconds(p.numel(), p.element_size(), emulated_compute.COPY_ACCESSES)

    @property
    def update_seconds_total(self) -> float:
        return sum(self.update_seconds(p) for p in self.parameters())


class VirtualGpuSGD(torch.optim.SGD):
    """torch.optim.SGD whose update of each parameter takes its time on the virtual GPU (queued after the summed
    gradient is here, before the next forward of its layer reads it), as a worker's update runs on a real GPU; the
    arithmetic runs only with `real` (the tests), never on the emulated hosts' CPU in timing mode. p3kv.torch's
    worker placement calls step() with one parameter at a time as its average lands; DDP's loop with all of them."""

    def __init__(self, params, net: EmulatedNet, real: bool, **settings):
        super().__init__(params, **settings)
        self._net, self._real = net, real

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._net.gpu.queue(self._net.update_seconds(p))
        if self._real:
            return super().step(closure)
        return None


def copy_weights_on_the_virtual_gpu(optimizer: torch.optim.Optimizer, net: EmulatedNet, real: bool) -> float:
    """Server placement (p3kv.torch.server_placement): the copy of the servers' new values into each parameter,
    which its synchronizer makes in the forward pre-hook of the parameter's layer, becomes what a GPU host makes of
    it: a device-to-device copy from the buffer cuda_staging.py landed the values in, queued on the virtual GPU
    before the layer's forward (its input is here when the hook runs). On the emulated hosts it would be a memcpy of
    every parameter per iteration (548 MiB at VGG-19) on the training loop's thread, CPU a GPU host does not spend.
    The copy is still made with `real` (the tests compare final weights). `optimizer`: the one
    p3kv.torch.distribute(..., placement='server') returned. Returns the copies' seconds per iteration."""
    sync = getattr(optimizer, "_p3kv_sync", None)
    host_copy = getattr(sync, "_apply", None)
    if host_copy is None or getattr(sync, "spec", None) is None:
        raise TypeError("copy_weights_on_the_virtual_gpu: pass the optimizer p3kv.torch.distribute(model, optimizer, "
                        "placement='server') returned")

    def apply(slots) -> None:
        for slot in slots:
            net.gpu.queue(net.copy_seconds(slot.param))
        if real:
            host_copy(slots)
        else:
            for slot in slots:
                slot.arrived = False  # what the copy leaves behind besides the values: nothing is pending

    sync._apply = apply
    return sum(net.copy_seconds(p) for p in net.parameters())
