"""A CPU double of the CUDA streams p3kv.torch.cuda_staging uses, so that the staging's ordering runs, and is
tested, on machines without a GPU (and in the GPU check's dry run).

The side stream is a thread that runs the work enqueued on it in order, each item after the event it waits on;
its events are threading.Events set when the thread reaches them. The current stream is the training thread
itself (CPU operations run at once): an event recorded on it is complete at once, and making it wait on an event
blocks the host, which is where the double differs from CUDA (there the device waits). `gate`, when given, must
be set before the side stream runs each item: a test holds it to see that nothing on the training thread waits
for a copy. `log` records what ran, in order (thread-safe appends).
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

import torch

from p3kv.core.errors import P3TimeoutError


class HostDouble:
    def __init__(self, gate: threading.Event | None = None):
        self.device = torch.device("cpu")
        self.gate = gate
        self.log: list[str] = []
        self.error: BaseException | None = None  # what a work item raised: every later query raises it
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._side_stream, name="p3kv side stream (double)", daemon=True).start()

    def host_like(self, t: torch.Tensor) -> torch.Tensor:
        return torch.empty(t.shape, dtype=t.dtype)

    def device_like(self, t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t, memory_format=torch.contiguous_format).detach()

    def record_current(self) -> threading.Event:
        event = threading.Event()
        event.set()  # the host has done everything enqueued so far
        return event

    def on_side(self, work: Callable[[], None], after: threading.Event | None = None,
                label: str = "") -> threading.Event:
        event = threading.Event()
        self._work.put((after, work, event, label))
        return event

    def done(self, event: threading.Event) -> bool:
        self._check()
        return event.is_set()

    def current_waits(self, event: threading.Event, timeout: float) -> None:
        self._check()
        if not event.wait(timeout):
            raise P3TimeoutError(f"the side stream (CPU double) did not reach an event within {timeout:g} s")
        self.log.append("current waited")

    def _side_stream(self) -> None:
        while True:
            after, work, event, label = self._work.get()
            if self.gate is not None:
                self.gate.wait()
            if after is not None:
                after.wait()
            try:
                work()
            except BaseException as e:  # on CUDA the enqueueing thread would have raised it
                self.error = e
                raise
            self.log.append(label or "work")
            event.set()

    def _check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"a side-stream work item (CPU double) failed: {self.error!r}") from self.error
