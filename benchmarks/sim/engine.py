"""The discrete-event core: an event loop, the NICs' queues and the CPU pools.

Queues are the only state the systems share; every one is lazily evaluated where that is exact (a FIFO server
only needs its next-free time when requests reach it in time order) and a real heap where order matters
(P3's priority queues).
"""

from __future__ import annotations

import heapq
from collections import deque

from benchmarks.sim.cluster import Cluster


class EventLoop:
    """Calls fn(*args) at time t, in (time, insertion) order. Single-threaded."""

    def __init__(self) -> None:
        self._heap: list = []
        self._seq = 0
        self.now = 0.0

    def at(self, t: float, fn, *args) -> None:
        heapq.heappush(self._heap, (t, self._seq, fn, args))
        self._seq += 1

    def run(self) -> None:
        heap = self._heap
        while heap:
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            fn(*args)


class CpuPool:
    """`cores` identical cores, first come first served; acquire() must be called in time order."""

    def __init__(self, cores: int | None) -> None:
        self._free = [0.0] * cores if cores else None

    def acquire(self, t: float, cost: float) -> float:
        """Returns when a job of `cost` core-seconds asked for at `t` ends."""
        if self._free is None or cost <= 0:
            return t + max(cost, 0.0)
        start = max(t, self._free[0])
        end = start + cost
        heapq.heapreplace(self._free, end)
        return end


class Server:
    """One thread serving jobs one at a time, by (priority, arrival) or by arrival; non-preemptive.

    `serve(job, now)` returns the job's service time; `done(job, now)` is called when it ends.
    """

    def __init__(self, loop: EventLoop, serve, done, prioritised: bool) -> None:
        self._loop, self._serve, self._done = loop, serve, done
        self._prioritised = prioritised
        self._queue: list | deque = [] if prioritised else deque()
        self._seq = 0
        self.busy = False

    def put(self, priority: int, job) -> None:
        if self._prioritised:
            heapq.heappush(self._queue, (priority, self._seq, job))
            self._seq += 1
        else:
            self._queue.append(job)
        if not self.busy:
            self._next()

    def _next(self) -> None:
        if not self._queue:
            self.busy = False
            return
        job = heapq.heappop(self._queue)[2] if self._prioritised else self._queue.popleft()
        self.busy = True
        now = self._loop.now
        self._loop.at(now + self._serve(job, now), self._finish, job)

    def _finish(self, job) -> None:
        self._done(job, self._loop.now)
        self._next()


class Network:
    """Every host's egress (a Server, so its order is the sender's) and ingress (lazy FIFO, see cluster.py).

    send(src, dst, nbytes, priority, on_arrival) delivers on_arrival(now) at the receiver. Busy intervals of every
    link are kept for utilisation plots when `record` is set.
    """

    def __init__(self, loop: EventLoop, cluster: Cluster, prioritised: bool, record: bool = False) -> None:
        self.loop, self.cluster = loop, cluster
        self._ingress_free = [0.0] * cluster.hosts
        self._egress = [Server(loop, self._transmit, self._sent, prioritised) for _ in range(cluster.hosts)]
        self.busy: dict[tuple[str, int], list[tuple[float, float, int]]] | None = {} if record else None

    def send(self, src: int, dst: int, nbytes: int, priority: int, on_arrival) -> None:
        if src == dst:  # the same host: no NIC
            on_arrival(self.loop.now)
            return
        self._egress[src].put(priority, (src, dst, nbytes, on_arrival))

    def _transmit(self, message, now: float) -> float:
        src, dst, nbytes, on_arrival = message
        wire = self.cluster.seconds_on_wire(nbytes)
        start = max(now, self._ingress_free[dst])
        end = max(start + wire, now + wire) + self.cluster.latency_s
        self._ingress_free[dst] = end - self.cluster.latency_s
        if self.busy is not None:
            self.busy.setdefault(("egress", src), []).append((now, now + wire, nbytes))
            self.busy.setdefault(("ingress", dst), []).append((end - wire, end, nbytes))
        self.loop.at(end, on_arrival, end)
        return wire

    def _sent(self, message, now: float) -> None:
        pass
