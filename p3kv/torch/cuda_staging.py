"""The GPU path: CUDA parameters and gradients go to and from p3kv's core through pinned host buffers, copied on
a side CUDA stream, ordered by events, so that the training thread never waits for a copy on the host.

For one key (a parameter, or a buffer that worker 0 broadcasts), per iteration:

1. Its gradient is final (post-accumulate-grad hook, on the thread and current stream autograd runs it with): the
   gradient times 1/world size goes into a device buffer (`send_dev`) on the current stream, as DDP copies it into
   its bucket, and an event is recorded there; the side stream waits on that event, copies `send_dev` to pinned
   host memory (`send_host`) and records `sent`. The hook returns at once.
2. The staging thread (one per process) sees `sent` complete (it polls events in enqueue order: the side stream
   runs in order) and pushes `send_host` to the core with the key's priority. The result (the average, worker
   placement; the new weights, server placement) lands in pinned host memory (`recv_host`).
3. The staging thread sees the push complete (P3Worker.completed: it polls, most urgent key first, so urgent
   copies are enqueued first), enqueues the copy host->device (`recv_dev`) on the side stream and records
   `landed`.
4. The next forward's pre-hook of the module reading the parameter (training thread) waits on the host only until
   step 3 has happened for its keys (the result is off the wire), then makes the current stream wait on `landed`
   (`Stream.wait_event`, no host synchronization) and enqueues the update (the user's optimizer on `recv_dev`, or
   the copy of the new weights into the parameter) on the current stream.

Reuse of the buffers is ordered by the side stream: a key is pushed again only after its previous result was
waited for (step 4), so its previous copy host->device was enqueued before the next copy device->host, and the
core writes `recv_host` again only after that next copy completed; the side stream reads no tensor of the
training loop's own (only `send_dev`), so the caching allocator's reuse of freed gradients cannot race with it.
Pinned buffers live as long as their key (the Staging object holds them; P3Worker holds the numpy views of an
operation, which keep the pinned tensors alive, until the core releases it, also after a timeout or an
interrupt).

`Streams` is what the staging needs of a device: CudaStreams for torch.cuda; p3kv.torch.stream_double.HostDouble
runs the same ordering on the CPU (a thread as the side stream) for tests and the GPU check's dry run.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Callable

import numpy as np
import torch

from p3kv.core.errors import ConfigError, P3Error, P3TimeoutError
from p3kv.torch import tensors

log = logging.getLogger("p3kv.torch")

_POLL_S = 0.0005  # the staging thread's pause between polls while copies or pushes are outstanding
_IDLE_S = 1.0  # its timed wait while nothing is outstanding (woken at once by new work)
_host_double = False  # tests and dry runs: stage CPU tensors through p3kv.torch.stream_double.HostDouble


def use_host_double(on: bool = True) -> None:
    """Tests and the GPU check's dry run: CPU models go through the staging path (a CPU double of the side
    stream) instead of the direct CPU path. Call before distribute()."""
    global _host_double
    _host_double = on


def model_device(model: torch.nn.Module) -> torch.device:
    """The one device holding the model's trained parameters and floating-point buffers; ConfigError when they
    are on several devices, or on one p3kv.torch does not stage (anything but CPU and CUDA)."""
    where: dict[torch.device, list[str]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            where.setdefault(p.device, []).append(name)
    for name, b in model.named_buffers():
        if b is not None and b.dtype in tensors.SUPPORTED:
            where.setdefault(b.device, []).append(name)
    if not where:
        return torch.device("cpu")
    if len(where) > 1:
        listed = "; ".join(f"{d}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
                           for d, names in where.items())
        raise ConfigError(f"the model's parameters and buffers are on several devices ({listed}); p3kv.torch "
                          "stages one device per worker process: move the whole model to one device, e.g. "
                          "model.to(f'cuda:{local_rank}'), as DistributedDataParallel needs too")
    device = next(iter(where))
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"the model is on {device}; p3kv.torch runs on CPU tensors or on one CUDA device")
    return device


def select(device: torch.device, worker, timeout: float) -> Staging | None:
    """The staging for a model on `device`: None for CPU tensors (the direct CPU path, the core reads and writes
    the tensors' memory), CUDA staging for a CUDA device."""
    if device.type == "cuda":
        return Staging(worker, CudaStreams(device), timeout)
    if _host_double:
        from p3kv.torch.stream_double import HostDouble

        return Staging(worker, HostDouble(), timeout)
    return None


class CudaStreams:
    """torch.cuda's streams and events, as the staging uses them."""

    def __init__(self, device: torch.device):
        self.device = device
        self.side = torch.cuda.Stream(device=device)

    def host_like(self, t: torch.Tensor) -> torch.Tensor:
        """Pinned (page-locked) host memory: copies to and from it run asynchronously, on the copy engines."""
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True)

    def device_like(self, t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t, memory_format=torch.contiguous_format).detach()

    def record_current(self):
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def on_side(self, work: Callable[[], None], after=None, label: str = ""):
        """Enqueues `work` (torch operations) on the side stream after `after`; the event that follows it.
        (`label` names the work in the CPU double's log.)"""
        with torch.cuda.device(self.device), torch.cuda.stream(self.side):
            if after is not None:
                self.side.wait_event(after)
            work()
            event = torch.cuda.Event()
            event.record(self.side)
        return event

    def done(self, event) -> bool:
        return bool(event.query())

    def current_waits(self, event, timeout: float) -> None:
        """The training thread's current stream waits on `event`: on the device, not on the host."""
        torch.cuda.current_stream(self.device).wait_event(event)


@dataclasses.dataclass(eq=False)
class StagedKey:
    """One key's buffers and its state in the current iteration."""

    key: str
    send_dev: torch.Tensor  # on the device: the gradient times 1/world size (what the copy to the host reads)
    send_host: torch.Tensor  # pinned: what the core sends
    send_np: np.ndarray
    recv_host: torch.Tensor  # pinned: what the core receives
    recv_np: np.ndarray
    recv_dev: torch.Tensor  # on the device: the result, once `landed`
    priority: int = 0
    sent: object = None  # side-stream event: send_host holds the gradient
    landed: object = None  # side-stream event: recv_dev holds the result
    ready: threading.Event = dataclasses.field(default_factory=threading.Event)  # step 3 done (or failed)
    error: BaseException | None = None


class Staging:
    """The staging of one worker process's keys (see the module doc). push/wait/init are called from the
    training thread; the staging thread pushes to and waits on the core."""

    def __init__(self, worker, streams, timeout: float):
        self.worker, self.streams, self.timeout = worker, streams, timeout
        self.device = streams.device
        self._cv = threading.Condition()
        self._copying: collections.deque[StagedKey] = collections.deque()  # step 1 enqueued, not pushed (FIFO)
        self._pushed: list[StagedKey] = []  # pushed, not landed (the staging thread's own)
        self._inits: list[tuple[torch.Tensor, StagedKey]] = []
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="p3kv staging", daemon=True)
        self._thread.start()

    def register(self, key: str, like: torch.Tensor) -> StagedKey:
        send_host, recv_host = self.streams.host_like(like), self.streams.host_like(like)
        return StagedKey(key, self.streams.device_like(like), send_host, tensors.view(send_host), recv_host,
                         tensors.view(recv_host), self.streams.device_like(like))

    # -- set-up (synchronous: once per key) ------------------------------------------------------------------
    def init(self, sk: StagedKey, value: torch.Tensor, wire_dtype: str) -> None:
        """Worker 0's `value` becomes every worker's (written back by finish_init, after the worker's wait)."""
        with torch.no_grad():
            sk.recv_host.copy_(value)  # blocking: the current stream's work on `value` is done first
        self.worker.init(sk.key, sk.recv_np, out=sk.recv_np, wire_dtype=wire_dtype)
        self._inits.append((value, sk))

    def finish_init(self) -> None:
        with torch.no_grad():
            for value, sk in self._inits:
                value.copy_(sk.recv_host)
        self._inits.clear()

    # -- training thread ------------------------------------------------------------------------------------
    def push(self, sk: StagedKey, source: torch.Tensor | None, scale: float | None, priority: int) -> None:
        """Step 1: `source` (None: zeros) times `scale` (None: as it is) leaves once the current stream has
        produced it. Returns at once (nothing waits on the host). The key's previous push must have been waited
        for."""
        self._check_alive()
        # The snapshot is taken on the current stream, in order with the work that wrote `source` and before any
        # that changes it later (the next backward accumulating into .grad, zero_grad(set_to_none=False), the
        # next forward updating a BatchNorm buffer); the side stream then reads only send_dev, which nothing else
        # writes until this key's result has been waited for.
        with torch.no_grad():
            if source is None:
                sk.send_dev.zero_()
            elif scale is None:
                sk.send_dev.copy_(source)
            else:
                torch.mul(source, scale, out=sk.send_dev)
        ready = self.streams.record_current()

        def copy_out(sk=sk):
            sk.send_host.copy_(sk.send_dev, non_blocking=True)

        sk.priority, sk.error, sk.landed = priority, None, None
        sk.ready.clear()
        sk.sent = self.streams.on_side(copy_out, after=ready, label=f"to host {sk.key}")
        with self._cv:
            self._copying.append(sk)
            self._cv.notify()

    def wait(self, sk: StagedKey) -> None:
        """Step 4: once the result is off the wire, the current stream waits for its copy to the device
        (sk.recv_dev); raises the push's error, or P3TimeoutError after the timeout (P3_TIMEOUT)."""
        deadline = time.monotonic() + self.timeout
        while not sk.ready.wait(min(1.0, max(0.0, deadline - time.monotonic()))):
            self._check_alive()
            if time.monotonic() >= deadline:
                raise P3TimeoutError(f"{sk.key} did not arrive within {self.timeout:g} s (P3_TIMEOUT)")
        if sk.error is not None:
            raise sk.error
        self.streams.current_waits(sk.landed, self.timeout)

    def _check_alive(self) -> None:
        if self._failure is not None:
            raise P3Error(f"p3kv's staging thread failed: {self._failure!r}") from self._failure

    # -- the staging thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                progressed = False
                while True:
                    with self._cv:
                        if not self._copying or not self.streams.done(self._copying[0].sent):
                            break
                        sk = self._copying.popleft()
                    self._push(sk)
                    progressed = True
                for sk in sorted(self._pushed, key=lambda s: -s.priority):  # most urgent first
                    if self.worker.completed(sk.key):
                        self._pushed.remove(sk)
                        self._land(sk)
                        progressed = True
                if not progressed:
                    with self._cv:
                        busy = bool(self._copying or self._pushed)
                        self._cv.wait(_POLL_S if busy else _IDLE_S)
        except BaseException as e:  # a bug here must not leave the training thread waiting forever
            self._failure = e
            log.exception("p3kv's staging thread failed")
            with self._cv:
                stranded = list(self._copying) + self._pushed
            for sk in stranded:
                sk.error = P3Error(f"p3kv's staging thread failed: {e!r}")
                sk.ready.set()

    def _push(self, sk: StagedKey) -> None:
        try:
            self.worker.push(sk.key, sk.send_np, out=sk.recv_np, priority=sk.priority)
        except BaseException as e:
            sk.error = e
            sk.ready.set()
            return
        self._pushed.append(sk)

    def _land(self, sk: StagedKey) -> None:
        try:
            self.worker.wait(sk.key)  # completed: returns at once, or raises the operation's error
        except BaseException as e:
            sk.error = e
            sk.ready.set()
            return

        def copy_in(sk=sk):
            sk.recv_dev.copy_(sk.recv_host, non_blocking=True)

        sk.landed = self.streams.on_side(copy_in, label=f"to device {sk.key}")
        sk.ready.set()
