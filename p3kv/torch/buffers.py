"""Module buffers (BatchNorm's running statistics) kept equal on every worker, as DDP's broadcast_buffers=True: after
each synchronized forward pass worker 0's floating-point buffers go to every worker, and the module owning a
buffer waits for it at the start of its next forward.

A broadcast over servers that only sum: worker 0 pushes its buffer, the others push zeros, so the sum is worker
0's value exactly (x + 0 = x). Integer buffers (num_batches_tracked) are not sent: every worker counts the same
forward passes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from p3kv.core.worker import P3Worker
from p3kv.torch import cuda_staging, tensors


@dataclasses.dataclass(eq=False)
class _Buffer:
    key: str
    module: torch.nn.Module
    attr: str  # the buffer's name inside its module
    send: torch.Tensor
    send_np: np.ndarray
    recv: torch.Tensor
    recv_np: np.ndarray
    pushed: bool = False
    staged: cuda_staging.StagedKey | None = None  # CUDA: through pinned host buffers (recv is then on the device)

    @property
    def value(self) -> torch.Tensor:
        return getattr(self.module, self.attr)


class BufferBroadcast:
    def __init__(self, model: torch.nn.Module, worker: P3Worker, staging: cuda_staging.Staging | None = None):
        self.worker, self.staging = worker, staging
        self._by_module: dict[int, list[_Buffer]] = {}
        self._all: list[_Buffer] = []
        for mname, module in model.named_modules():
            for attr, buf in module.named_buffers(recurse=False):
                if buf is None or buf.dtype not in tensors.SUPPORTED:
                    continue
                name = f"{mname}.{attr}" if mname else attr
                tensors.check(f"buffer {name!r}", buf)
                if staging is None:
                    send, send_np = tensors.buffer_like(buf)
                    recv, recv_np = tensors.buffer_like(buf)
                    send.zero_()
                    b = _Buffer(f"buffer:{name}", module, attr, send, send_np, recv, recv_np)
                else:
                    sk = staging.register(f"buffer:{name}", buf)
                    b = _Buffer(sk.key, module, attr, sk.send_dev, sk.send_np, sk.recv_dev, sk.recv_np, staged=sk)
                self._by_module.setdefault(id(module), []).append(b)
                self._all.append(b)

    def owners(self) -> dict[str, torch.nn.Module]:
        return {b.key: b.module for b in self._all}

    def has(self, module: torch.nn.Module) -> bool:
        return id(module) in self._by_module

    def init(self) -> None:
        for b in self._all:
            if b.staged is not None:
                self.staging.init(b.staged, b.value, tensors.wire_dtype(b.value))
                continue
            value = tensors.view(b.value)
            self.worker.init(b.key, value, out=value, wire_dtype=tensors.wire_dtype(b.value))

    def push(self, order) -> None:
        for b in self._all:
            self._wait(b)
            if b.staged is not None:
                self.staging.push(b.staged, b.value if self.worker.rank == 0 else None, None, order.of(b.key))
                b.pushed = True
                continue
            if self.worker.rank == 0:
                b.send.copy_(b.value)
            self.worker.push(b.key, b.send_np, out=b.recv_np, priority=order.of(b.key))
            b.pushed = True

    def _wait(self, b: _Buffer) -> bool:
        if not b.pushed:
            return False
        if b.staged is not None:
            self.staging.wait(b.staged)
        else:
            self.worker.wait(b.key)
        b.pushed = False
        return True

    def finish(self, module: torch.nn.Module) -> None:
        for b in self._by_module.get(id(module), ()):
            if self._wait(b):
                with torch.no_grad():
                    b.value.copy_(b.recv)

    def finish_unowned(self, ran: set) -> None:
        """Buffers of modules whose forward did not run in the learned pass: finished by the root."""
        for b in self._all:
            if id(b.module) not in ran and self._wait(b):
                with torch.no_grad():
                    b.value.copy_(b.recv)

    def finish_all(self) -> None:
        for b in self._all:
            if self._wait(b):
                with torch.no_grad():
                    b.value.copy_(b.recv)
