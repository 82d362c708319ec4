"""Torch tensors as the numpy arrays p3kv's core reads and writes (shared memory, no copy)."""

from __future__ import annotations

import numpy as np
import torch

from p3kv.core.errors import ConfigError

# torch dtypes the core aggregates, by the core's names (float16 and bfloat16 are summed in float32). numpy has no
# bfloat16: its tensors are shared as int16 views of the bits, and the core is told the real type (wire_dtype).
SUPPORTED = {torch.float32: "float32", torch.float16: "float16", torch.float64: "float64",
             torch.bfloat16: "bfloat16"}


def check(name: str, tensor: torch.Tensor) -> None:
    """ConfigError unless `tensor` can go to the core: a dense, contiguous tensor of a supported dtype, on the CPU
    (shared with the core) or on a CUDA device (staged through pinned host memory, p3kv.torch.cuda_staging)."""
    if tensor.dtype not in SUPPORTED:
        raise ConfigError(f"{name} has dtype {tensor.dtype}; p3kv.torch supports {', '.join(SUPPORTED.values())}")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ConfigError(f"{name} is on {tensor.device}; p3kv.torch runs on CPU tensors or on one CUDA device")
    if tensor.layout is not torch.strided or not tensor.is_contiguous():
        raise ConfigError(f"{name} is not a dense contiguous tensor; p3kv.torch shares it with the core as one "
                          "flat array")


def view(tensor: torch.Tensor) -> np.ndarray:
    """The numpy array sharing `tensor`'s memory (detached: writes bypass autograd); bfloat16 as int16 bits."""
    t = tensor.detach()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


def wire_dtype(tensor: torch.Tensor) -> str:
    """The core's name for `tensor`'s element type (P3Worker.init's wire_dtype)."""
    return SUPPORTED[tensor.dtype]


def buffer_like(tensor: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """A new tensor of `tensor`'s shape and dtype (uninitialised) and its numpy view."""
    t = torch.empty_like(tensor, memory_format=torch.contiguous_format).detach()
    return t, view(t)
