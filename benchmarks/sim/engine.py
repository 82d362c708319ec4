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

    `window`: how many jobs are already committed in arrival order ahead of the priority queue, the one in
    service included. 1 is P3's ideal (an urgent job waits for at most the one in service); MXNet's P3 van hands
    messages to a ZMQ socket whose send high-water mark holds DMLC_PS_WATER_MARK (10) of them, so an urgent
    slice waits behind up to 10 less urgent ones. `serve(job, now)` returns the job's service time;
    `done(job, now)` is called when it ends.
    """

    def __init__(self, loop: EventLoop, serve, done, prioritised: bool, window: int = 1) -> None:
        self._loop, self._serve, self._done = loop, serve, done
        self._prioritised = prioritised
        self._queue: list | deque = [] if prioritised else deque()
        self._window = window
        self._committed: deque = deque()  # window > 1 only: jobs taken from the heap, in order
        self._seq = 0
        self.busy = False

    def put(self, priority: int, job) -> None:
        if not self.busy and self._window == 1 and not self._queue:  # idle: serve it now, no queue round trip
            self.busy = True
            now = self._loop.now
            seconds = self._serve(job, now)
            if seconds > 0:
                self._loop.at(now + seconds, self._finish, job)
                return
            self._done(job, now)
            self._next()
            return
        if self._prioritised:
            heapq.heappush(self._queue, (priority, self._seq, job))
            self._seq += 1
        else:
            self._queue.append(job)
        if self._window > 1:
            self._fill()
        if not self.busy:
            self._next()

    def _fill(self) -> None:
        # The committed jobs include the one in service, so a busy server holds window - 1 more.
        room = self._window - len(self._committed) - (1 if self.busy else 0)
        while room > 0 and self._queue:
            self._committed.append(heapq.heappop(self._queue)[2] if self._prioritised else self._queue.popleft())
            room -= 1

    def _pick(self):
        if self._window > 1:
            if not self._committed:
                self._fill()
            return self._committed.popleft() if self._committed else None
        if not self._queue:
            return None
        return heapq.heappop(self._queue)[2] if self._prioritised else self._queue.popleft()

    def _next(self) -> None:
        # A job that takes no time (no CPU cost) is done at once, without an event: the same order, fewer events.
        loop = self._loop
        while True:
            job = self._pick()
            if job is None:
                self.busy = False
                return
            self.busy = True
            now = loop.now
            seconds = self._serve(job, now)
            if seconds > 0:
                loop.at(now + seconds, self._finish, job)
                if self._window > 1:
                    self._fill()
                return
            self._done(job, now)

    def _finish(self, job) -> None:
        self._done(job, self._loop.now)
        self._next()


class Link:
    """A sender's egress with window 1 and nothing to do when a message ends: like Server, but a message that
    finds the link idle and nothing queued starts at once, and an event is scheduled only to start the next
    queued message when the link frees (most messages at low load need no event of their own)."""

    def __init__(self, loop: EventLoop, serve, prioritised: bool) -> None:
        self._loop, self._serve = loop, serve
        self._prioritised = prioritised
        self._queue: list | deque = [] if prioritised else deque()
        self._seq = 0
        self._free_at = 0.0
        self._wake = False

    def put(self, priority: int, job) -> None:
        now = self._loop.now
        if not self._wake and now >= self._free_at:
            self._free_at = now + self._serve(job, now)
            return
        if self._prioritised:
            heapq.heappush(self._queue, (priority, self._seq, job))
            self._seq += 1
        else:
            self._queue.append(job)
        if not self._wake:
            self._wake = True
            self._loop.at(self._free_at, self._start)

    def _start(self) -> None:
        now = self._loop.now
        job = heapq.heappop(self._queue)[2] if self._prioritised else self._queue.popleft()
        self._free_at = now + self._serve(job, now)
        if self._queue:
            self._loop.at(self._free_at, self._start)
        else:
            self._wake = False


class Network:
    """Every host's egress (a Server, so its order is the sender's) and ingress (lazy FIFO, see cluster.py).

    send(src, dst, nbytes, priority, on_arrival) delivers on_arrival(now) at the receiver. Busy intervals of every
    link are kept for utilisation plots when `record` is set.
    """

    def __init__(self, loop: EventLoop, cluster: Cluster, prioritised: bool, record: bool = False,
                 window: int = 1) -> None:
        self.loop, self.cluster = loop, cluster
        self._ingress_free = [0.0] * cluster.hosts
        self._egress = [Link(loop, self._transmit, prioritised) if window == 1 else
                        Server(loop, self._transmit, self._sent, prioritised, window) for _ in range(cluster.hosts)]
        self._seconds_per_byte = cluster.seconds_on_wire(1.0)
        self._latency = cluster.latency_s
        self.busy: dict[tuple[str, int], list[tuple[float, float, int]]] | None = {} if record else None

    def send(self, src: int, dst: int, nbytes: int, priority: int, on_arrival, *args) -> None:
        """on_arrival(now, *args) at the receiver (at once on the same host: no NIC)."""
        if src == dst:
            on_arrival(self.loop.now, *args)
            return
        self._egress[src].put(priority, (src, dst, nbytes, on_arrival, args))

    def _transmit(self, message, now: float) -> float:
        src, dst, nbytes, on_arrival, args = message
        wire = nbytes * self._seconds_per_byte
        free = self._ingress_free[dst]
        end = (free if free > now else now) + wire
        self._ingress_free[dst] = end
        end += self._latency
        if self.busy is not None:
            self.busy.setdefault(("egress", src), []).append((now, now + wire, nbytes))
            self.busy.setdefault(("ingress", dst), []).append((end - wire, end, nbytes))
        self.loop.at(end, on_arrival, end, *args)
        return wire

    def _sent(self, message, now: float) -> None:
        pass
