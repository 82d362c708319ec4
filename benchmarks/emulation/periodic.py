"""A monitor's sampling thread: `sample()` every `interval` seconds until stopped, its own CPU time counted (the
link monitor and the socket monitor run on such a thread of the runner, outside the hosts' CPU quotas).

When the machine is busy and a sample runs late, the missed ticks are skipped, not caught up: the interval between
two samples stays at least `interval`. A failing sample ends the thread and is kept in `error` (logged with what
stays incomplete): a monitor must never abort the run it watches.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

LOG = logging.getLogger("periodic")


class PeriodicSampler:
    """Calls `sample` every `interval` seconds on a daemon thread named `name` (start ... stop); `what` names what
    goes incomplete when a sample fails. The monitors subclass it (their `sample` method as `sample`)."""

    def __init__(self, sample: Callable[[], None], interval: float, name: str, what: str):
        self.interval = interval
        self.cpu_s = 0.0  # the thread's own CPU time
        self.error: str | None = None
        self._sample, self._what = sample, what
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        begin = time.thread_time()
        try:
            next_at = time.monotonic()
            while not self._stopped.is_set():
                self._sample()
                next_at += self.interval
                delay = next_at - time.monotonic()
                if delay < 0:  # fell behind (the machine was busy): keep the interval, skip the missed ticks
                    next_at = time.monotonic()
                    delay = 0.0
                self._stopped.wait(delay)
        except Exception as e:  # a monitor failure must not abort the run it watches
            self.error = str(e)
            LOG.exception("sampling failed; %s will be incomplete", self._what)
        finally:
            self.cpu_s = time.thread_time() - begin
