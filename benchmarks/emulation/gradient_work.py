"""The frameworks' own gradient work on the virtual GPU: what DDP's reducer and p3kv.torch's gradient hooks do to
the gradients during backward, made what a GPU host makes of it.

On a GPU host the gradients live on the device, and what each system does to them before they leave is a kernel on
the compute stream: DDP's reducer copies each gradient into its bucket scaled by 1/W (`mul.out`) as the gradient
becomes final, and copies the reduced buckets back into the gradients (`copy_`) when backward ends (its
finalize_backward, before the optimizer's step); p3kv.torch scales each gradient by 1/W into its send buffer
(`torch.mul(..., out=)`, synchronizer.py and cuda_staging.py) before the copy to the host. The emulated workers hold
CPU tensors, so without this those passes are memcpys on the training loop's thread, the thread the emulation caps
at one dilated CPU (thread_cap.py): a pass over VGG-19's 548 MiB costs ~50 ms of this machine's CPU, about 1 s at
`--gpu-scale` 0.05, where a P100 spends 1.6 ms. DDP's copy back lands between its last all-reduce and the step, on
the critical path, so the host's memcpy charged DDP for work its GPU would barely notice.

`GradientWorkOnTheVirtualGpu` is a TorchDispatchMode the worker enters around `loss.backward()`: every write into
an existing float tensor (`mul.out`, `div.out`, `copy_`, in-place `mul_`/`div_`/`add_`, `zero_`,
`fill_`) on the training loop's thread becomes an operation on the virtual GPU at its memory traffic (one pass per
tensor read or written, at the emulated GPU's memory bandwidth), waited for before the host goes on (what follows
reads its output: the bucket's all-reduce, the push of the send buffer). A copy (`copy_`) brings in what came off
the wire (DDP's reduced buckets; p3kv.torch's averages in synchronize()), so it is queued when the host issues it;
the other writes read gradients the device has just produced, so they are chained behind its work (the host's
lateness in issuing them absorbed, as for a backward layer: torch_compute.VirtualGpu.chain). In timing mode
nothing is computed (the values are the fixed gradients' anyway); with `real` (the tests) the op runs on the host
too, so the final weights still show each system did the work. Gloo's own threads (its sums, NCCL's work on a
GPU host) and p3kv's C++ threads do not see the mode (it is thread-local). The emulated layers' own backward
(torch_compute._LayerFunction) writes nothing in timing mode and, with `real`, computes its gradients out of place,
so the mode charges only the frameworks' work.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# The writes the mode takes over: op -> (the argument written: an index into args or a keyword, the passes besides
# reading the tensor arguments the size of the output, i.e. the write itself).
WRITES = {
    aten.mul.out: ("out", 1),
    aten.div.out: ("out", 1),
    aten.copy_.default: (0, 1),
    aten.mul_.Tensor: (0, 1),
    aten.mul_.Scalar: (0, 1),
    aten.div_.Tensor: (0, 1),
    aten.div_.Scalar: (0, 1),
    aten.add_.Tensor: (0, 1),
    aten.zero_.default: (0, 1),
    aten.fill_.Scalar: (0, 1),
}
# In-place ops also read the tensor they write.
READS_OUTPUT = {aten.mul_.Tensor, aten.mul_.Scalar, aten.div_.Tensor, aten.div_.Scalar, aten.add_.Tensor}
QUEUED = {aten.copy_.default}  # inputs from off the device (the module doc); the others are chained


@dataclasses.dataclass
class GradientWorkStats:
    """What the mode moved onto the virtual GPU since the last reset."""

    entered: int = 0  # times the mode was entered (backward passes)
    ops: int = 0
    bytes: int = 0  # bytes read and written
    seconds: float = 0.0  # virtual-GPU time

    def per_entry(self) -> dict:
        """Per backward pass: the ops, bytes and virtual-GPU seconds (zeros before any)."""
        n = max(self.entered, 1)
        return {"ops": self.ops / n, "bytes": self.bytes / n, "seconds": self.seconds / n}


def accesses_of(func, args: tuple, kwargs: dict) -> tuple[torch.Tensor, int] | None:
    """The tensor `func` writes and its passes over that tensor's size (reads of same-sized tensor arguments, the
    write, the read of an in-place op's own input); None for anything the mode leaves alone (other ops, non-float
    outputs such as DDP's bookkeeping maps)."""
    spec = WRITES.get(func)
    if spec is None:
        return None
    where, writes = spec
    out = kwargs.get(where) if isinstance(where, str) else args[where]
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        return None
    reads = sum(1 for a in (*args, *kwargs.values())
                if isinstance(a, torch.Tensor) and a is not out and a.numel() == out.numel())
    return out, reads + writes + (1 if func in READS_OUTPUT else 0)


class GradientWorkOnTheVirtualGpu(TorchDispatchMode):
    """Enter around `loss.backward()` on the training loop's thread (the module doc). `gpu`: the net's VirtualGpu;
    `seconds_of(elements, itemsize, accesses)`: the emulated GPU's memory time (emulated_compute.Profile's
    memory_seconds); `real`: run the op on the host too."""

    def __init__(self, gpu, seconds_of, real: bool):
        super().__init__()
        self.gpu, self.seconds_of, self.real = gpu, seconds_of, real
        self.stats = GradientWorkStats()

    def __enter__(self):
        self.stats.entered += 1
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        found = accesses_of(func, args, kwargs)
        if found is None:
            return func(*args, **kwargs)
        out, accesses = found
        seconds = self.seconds_of(out.numel(), out.element_size(), accesses)
        end = self.gpu.queue(seconds) if func in QUEUED else self.gpu.chain(seconds)
        self.stats.ops += 1
        self.stats.bytes += accesses * out.numel() * out.element_size()
        self.stats.seconds += seconds
        result = func(*args, **kwargs) if self.real else out
        self.gpu.wait(end)
        return result

    def reset_stats(self) -> None:
        self.stats = GradientWorkStats()
