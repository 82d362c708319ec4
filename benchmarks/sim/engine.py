"""The discrete-event core: an event loop, CPUs shared by processor sharing, serial threads on them, a serial
device (the virtual GPU) and a network whose links are shared fairly by the messages on them.

Why these models (each is the emulation's rule, benchmarks/emulation/ and cpp/src/virtual_stream.h):
- CPU: an emulated host's processes run in a cgroup with a CPU bandwidth quota (cpu_limit.py) that the kernel's
  scheduler time-slices among the host's runnable threads; without limits every host's threads time-slice the
  machine's cores. Either way a pool of C cores serves n runnable threads at min(1, C / n) core each
  (processor sharing; one thread never uses more than one core), not one after another. With the emulation's
  per-thread caps (thread_cap.py: each thread at one dilated CPU, gpu_scale cores) a thread gets at most that:
  min(cap, C / n).
- Threads: a server's consumer thread or a worker's receive thread handles one message at a time, in its queue's
  order (by priority where the system orders it), each message's CPU served by its host's pool.
- Device: the virtual GPU runs one operation at a time in the order the engine dispatched them; an operation
  starts where the work before it ended or when it became ready, whichever is later (chained), except that a
  dispatch slack may forgive a short gap before an operation that waited for the network (the rule of the runs
  before chaining, 1 ms).
- Network: every host's NIC has `rate` each way (tc's token bucket on each direction of its veth), shared
  equally by the messages crossing it (FairNetwork says why per direction and not end to end). Which messages
  are active at once is the sender's business (sender.py): p3kv's one send thread writes the most urgent frame
  into its destination's socket while that socket has room, holding the others back while it has none, and a
  socket frees bytes only as they are delivered; MXNet's P3 van does the same over ZMQ pipes and autotuned
  sockets (their room measured: sockets.py); dist_sync's ZMQ sockets send to every destination at once.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque

from benchmarks.sim.cluster import Cluster
from benchmarks.sim.sender import Sender


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


class SharedCpu:
    """`cores` of CPU bandwidth (None: unlimited) shared by the runnable jobs: n of them each run at
    min(per_job, cores / n) core (processor sharing, a job being one thread's work; per_job: what one thread may
    use, a core, or the emulation's per-thread cap). All jobs advance at the same rate, so the pool keeps a
    virtual time (core-seconds each job has received) and a job admitted at virtual time v with cost c ends when
    virtual time reaches v + c: one heap, no per-job bookkeeping on every change."""

    def __init__(self, loop: EventLoop, cores: float | None, per_job: float = 1.0) -> None:
        if cores is not None and cores <= 0:
            raise ValueError(f"a CPU pool needs a positive number of cores, not {cores}")
        if per_job <= 0:
            raise ValueError(f"a thread needs a positive share of a core, not {per_job}")
        self.loop, self.cores, self.per_job = loop, cores, per_job
        self._heap: list = []  # (virtual finish time, seq, done, args)
        self._seq = itertools.count()
        self._virtual = 0.0
        self._t = 0.0
        self._token = 0
        self.busy_core_s = 0.0  # core-seconds served so far (the pool's CPU use)

    # The simulator's hottest code (every message on a link and every CPU job passes it): a thread's rate,
    # min(per_job, cores / n), and EventLoop.at are inlined by hand, the same arithmetic in the same order.
    def _advance(self) -> None:
        now = self.loop.now
        n = len(self._heap)
        if n and now > self._t:
            rate = self.cores / n
            if rate > self.per_job:
                rate = self.per_job
            self._virtual += (now - self._t) * rate
            self.busy_core_s += (now - self._t) * rate * n
        self._t = now

    def run(self, cost: float, done, *args) -> None:
        """done(*args) once `cost` core-seconds have been served (at once for a cost of 0)."""
        if cost <= 0:
            done(*args)
            return
        if self.cores is None:  # no sharing: every job has a core (or its cap) of its own
            self.busy_core_s += cost
            self.loop.at(self.loop.now + cost / self.per_job, done, *args)
            return
        self._advance()
        heapq.heappush(self._heap, (self._virtual + cost, next(self._seq), done, args))
        self._schedule()

    def _schedule(self) -> None:
        self._token += 1
        heap = self._heap
        if heap:
            ahead = heap[0][0] - self._virtual
            rate = self.cores / len(heap)
            if rate > self.per_job:
                rate = self.per_job
            loop = self.loop
            heapq.heappush(loop._heap, (self._t + (ahead if ahead > 0.0 else 0.0) / rate, loop._seq, self._wake,
                                        (self._token,)))
            loop._seq += 1

    def _wake(self, token: int) -> None:
        if token != self._token:  # the set of jobs changed since: a later event stands for this one
            return
        self._advance()
        heap = self._heap
        finished = [heapq.heappop(heap)]  # the job this event was scheduled for, whatever the rounding
        if finished[0][0] > self._virtual:
            self._virtual = finished[0][0]
        virtual = self._virtual
        while heap and heap[0][0] <= virtual + 1e-12 * (1.0 + virtual):
            finished.append(heapq.heappop(heap))
        self._schedule()
        for _, _, done, args in finished:
            done(*args)


def host_cpus(cluster: Cluster, loop: EventLoop) -> list[SharedCpu]:
    """One SharedCpu per host of `cluster` (the same object for every host when they share a machine's cores),
    each thread on it at most `cluster.thread_cores` (the per-thread caps) or a core."""
    per_job = cluster.thread_cores or 1.0
    if cluster.shared_cores:
        shared = SharedCpu(loop, cluster.shared_cores, per_job)
        return [shared] * cluster.hosts
    return [SharedCpu(loop, cluster.cores, per_job) for _ in range(cluster.hosts)]


class CpuThread:
    """One thread serving its jobs one at a time on a SharedCpu, by (priority, arrival) or by arrival;
    non-preemptive. cost(job) is asked when the job starts (it may depend on the jobs served before it),
    done(job) is called when it ends."""

    def __init__(self, cpu: SharedCpu, cost, done, prioritised: bool) -> None:
        self._cpu, self._cost, self._done = cpu, cost, done
        self._prioritised = prioritised
        self._queue: list | deque = [] if prioritised else deque()
        self._seq = itertools.count()
        self.busy = False

    def put(self, priority: int, job) -> None:
        if self._prioritised:
            heapq.heappush(self._queue, (priority, next(self._seq), job))
        else:
            self._queue.append(job)
        if not self.busy:
            self._next()

    def _next(self) -> None:
        self.busy = True  # a zero-cost job's done() may put() more: it is queued, not served inside this loop
        queue = self._queue
        while queue:
            job = heapq.heappop(queue)[2] if self._prioritised else queue.popleft()
            cost = self._cost(job)
            if cost > 0:
                self._cpu.run(cost, self._finish, job)
                return
            self._done(job)
        self.busy = False

    def _finish(self, job) -> None:
        self._done(job)
        self._next()


class Device:
    """A serial device (one GPU stream): operations run one at a time in submission order. An operation starts
    when the device is free or when it was submitted (it became ready), whichever is later; with a `slack`, an
    operation submitted as `waited` (it waited for the network) that comes less than `slack` after the device went
    idle starts as if it had come at once (the gap forgiven, as the virtual GPU did before operations were
    chained)."""

    def __init__(self, loop: EventLoop, slack_s: float = 0.0) -> None:
        self.loop, self.slack_s = loop, slack_s
        self._queue: deque = deque()
        self._busy = False
        self._end = 0.0

    def submit(self, seconds: float, waited: bool, done, *args) -> None:
        self._queue.append((seconds, waited, done, args))
        if not self._busy:
            self._start()

    def _start(self) -> None:
        seconds, waited, done, args = self._queue.popleft()
        now = self.loop.now
        start = self._end if waited and now - self._end < self.slack_s else now
        self._busy = True
        self.loop.at(max(start + seconds, now), self._finish, done, args)

    def _finish(self, done, args) -> None:
        self._end = self.loop.now
        done(*args)  # still busy: what it submits queues behind what was already waiting
        self._busy = False
        if self._queue:
            self._start()


class _Pipe:
    """One connection's messages: those waiting, whether one is leaving the sender, the bytes in flight."""

    __slots__ = ("waiting", "sending", "flight")

    def __init__(self) -> None:
        self.waiting: deque = deque()
        self.sending = False
        self.flight = 0.0


class _Message:
    __slots__ = ("pipe", "sender", "message", "start", "left")

    def __init__(self, pipe, sender, message, start):
        self.pipe, self.sender, self.message, self.start, self.left = pipe, sender, message, start, 2


class FairNetwork:
    """Every host's NIC, `cluster.rate_bps` each way (None: unlimited; Cluster.wire_overhead adds the
    TCP/IP/Ethernet headers), each direction shared equally by the messages on it (processor sharing of the
    link, what TCP flows through one token bucket converge to). A message holds its sender's egress and its
    receiver's ingress from the moment it starts (cut-through), leaves the sender when its egress share has sent
    it, and arrives `latency_s` after both its egress and its ingress are done.

    Why two stages and not one end-to-end max-min allocation: in the emulation a sender is not slowed by a
    receiver that other senders keep busy, as far as the tbf queue in front of that receiver and the sender's
    socket hold. The end-to-end version made workers that push slice i to the same server in lockstep wait for
    each other, and put p3kv 18-30% above its measured time at every fit point where the emulation measured it
    near the link bound. What a socket holds is the sender's limit (sender.py), and a sender's `flight_bytes`
    (the congestion window) caps the bytes one connection has started and not yet delivered.
    `record`: busy intervals per (direction, host) for utilisation plots."""

    def __init__(self, loop: EventLoop, cluster: Cluster, record: bool = False) -> None:
        self.loop = loop
        self._seconds_per_byte = cluster.seconds_on_wire(1.0)  # 0: unlimited
        self._latency = cluster.latency_s
        self._ids = itertools.count()
        self._pipes: dict[tuple[int, int], _Pipe] = {}
        self._egress = [SharedCpu(loop, 1.0) for _ in range(cluster.hosts)]  # link time, shared like a core
        self._ingress = [SharedCpu(loop, 1.0) for _ in range(cluster.hosts)]
        self.busy: dict[tuple[str, int], list[tuple[float, float, float]]] | None = {} if record else None

    def sender(self, host: int, prioritised: bool, window: int | None, socket_bytes: float | None = None,
               flight_bytes: float | None = None) -> Sender:
        return Sender(self, host, prioritised, window, socket_bytes, flight_bytes)

    def _enqueue(self, sender: Sender, message) -> None:
        dst, nbytes, on_arrival, args, on_start = message
        if not self._seconds_per_byte:  # unlimited links: only the latency
            if on_start is not None:
                on_start(*args)
            self.loop.at(self.loop.now + self._latency, on_arrival, self.loop.now + self._latency, *args)
            sender._sent()
            return
        key = (sender.id, dst)
        pipe = self._pipes.get(key)
        if pipe is None:
            pipe = self._pipes[key] = _Pipe()
        pipe.waiting.append(message)
        self._next(sender, pipe)

    def _next(self, sender: Sender, pipe: _Pipe) -> None:
        """Start the pipe's next message once the one before it has left, and (a sender with a cap on what one
        connection has in flight: the congestion window) once what is in flight leaves room for it."""
        if pipe.sending or not pipe.waiting:
            return
        nbytes = pipe.waiting[0][1]
        if sender.flight_bytes and pipe.flight and pipe.flight + nbytes > sender.flight_bytes:
            return
        message = pipe.waiting.popleft()
        dst, nbytes, _, args, on_start = message
        pipe.sending, pipe.flight = True, pipe.flight + nbytes
        m = _Message(pipe, sender, message, self.loop.now)
        if on_start is not None:
            on_start(*args)
        seconds = nbytes * self._seconds_per_byte
        self._egress[sender.host].run(seconds, self._sent, m)
        self._ingress[dst].run(seconds, self._half_done, m)

    def _sent(self, m: _Message) -> None:
        if self.busy is not None:
            self.busy.setdefault(("egress", m.sender.host), []).append((m.start, self.loop.now, m.message[1]))
        m.pipe.sending = False
        self._next(m.sender, m.pipe)
        m.sender._sent()
        self._half_done(m)

    def _half_done(self, m: _Message) -> None:
        """Its egress or its ingress is done; with both, the message is there."""
        m.left -= 1
        if m.left:
            return
        dst, nbytes, on_arrival, args, _ = m.message
        m.pipe.flight -= nbytes
        self._next(m.sender, m.pipe)
        arrive = self.loop.now + self._latency
        if self.busy is not None:
            self.busy.setdefault(("ingress", dst), []).append((m.start + self._latency, arrive, nbytes))
        if self._latency:
            self.loop.at(arrive, on_arrival, arrive, *args)
        else:
            on_arrival(arrive, *args)
