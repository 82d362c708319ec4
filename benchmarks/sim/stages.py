"""A received message's CPU through a process's threads in turn: the serial threads it passes, then an OpenMP team.

ps-lite's receive path is not one thread. A message is read by ZMQ's I/O thread, handed through the van and the
customer to MXNet's engine, whose worker thread runs the copy and the sum with OpenMP. Under the emulation's
per-thread caps (one dilated CPU per thread) what limits such a process is its busiest thread, not the sum of its
threads' work, so charging everything to one thread (the first model) made dist_sync and MXNet's P3 two to three
times too slow at VGG-19; so did splitting one loopback-fitted cost over the threads by their measured shares (the
second), because the loopback cost overstates what each thread spends under the emulation. The costs here are the
threads' own: each capped run records the busiest threads of each role's busiest process
(benchmarks/emulation/thread_usage.py, the rows' thread_cpu), and threads.py fits each thread's CPU per message and
per byte on the fit split's rows. A message pays stage k's `stages[k]` on that thread in turn; the last stage then
runs the OpenMP loop, `team` split evenly over the team's threads (the last stage's thread among them, as the
team's master), the message done when the last of them ends.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Callable

from benchmarks.sim.cluster import CpuCosts
from benchmarks.sim.engine import CpuThread, SharedCpu


@dataclasses.dataclass(frozen=True)
class ThreadCosts:
    """What one received message costs each thread of a process (core-seconds: per message, per payload byte)."""

    stages: tuple[CpuCosts, ...]  # the serial threads it passes in turn, in order
    team: CpuCosts = CpuCosts()  # the OpenMP loop at the end of the last stage, over all of the team's threads

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a process's thread costs need at least one stage")
        if any(c.per_message < 0 or c.per_byte < 0 for c in (*self.stages, self.team)):
            raise ValueError(f"negative thread costs: {self}")


class TeamCpu:
    """An engine thread whose every job ends with an OpenMP loop: its own cost on the thread alone, then the loop's
    cost split evenly over `team` threads (itself among them) on `cpu`; done when the last one ends."""

    def __init__(self, cpu: SharedCpu, team: int) -> None:
        if team < 1:
            raise ValueError(f"an OpenMP team of {team} threads")
        self.cpu, self.team = cpu, team

    def run(self, own: float, loop_cost: float, done, *args) -> None:
        chunk = loop_cost / self.team
        left = [self.team]

        def one() -> None:
            left[0] -= 1
            if left[0] == 0:
                done(*args)

        def loop() -> None:
            for _ in range(self.team):
                self.cpu.run(chunk, one)

        if own > 0:
            self.cpu.run(own, loop)
        else:
            loop()


class _LastStage:
    """The last stage's CPU target. CpuThread asks it to run a job's whole cost (run(cost, done, job)); the part of
    it that is the team's loop (`loop_cost(job)`) runs over the team, the rest on the thread alone first."""

    def __init__(self, cpu: SharedCpu, team: int, loop_cost: Callable) -> None:
        self._team = TeamCpu(cpu, team) if team > 1 else None
        self._cpu, self._loop_cost = cpu, loop_cost

    def run(self, cost: float, done, job) -> None:
        loop = self._loop_cost(job)
        if self._team is None or loop <= 0:
            self._cpu.run(cost, done, job)
        else:
            self._team.run(max(0.0, cost - loop), loop, done, job)


class _Read:
    """One message on its way in: its first stage (the thread that reads the socket) works on it as its bytes come,
    so the message moves on once that thread is done with it and its last byte is there."""

    __slots__ = ("job", "read", "here")

    def __init__(self, job) -> None:
        self.job, self.read, self.here = job, False, False


class Stages:
    """Serial threads on `cpu` that a job of `nbytes_of(job)` bytes passes in turn, stage k paying
    `costs.stages[k]`; the last stage then runs `costs.team` as an OpenMP loop over `team` threads, and `extra(job)`
    (an update with the last push) is the last stage's own. Stages before the last serve in arrival order; the last
    by `priority_of(job)` where one is given. `done(job)` when the last stage ends.

    The first stage reads the socket: begin(job) when the message's first byte leaves its sender, arrived(token)
    when its last is in; it may work on the message in between (ZMQ's I/O thread reads a message as it comes, which
    hides most of a 100 MB part's reading behind its transfer). put(job): a message that is all here already.

    `blocking`: the threads after the first take one message at a time between them, the next one entering only
    when the last thread is done with the one before (MXNet's server: ps-lite's customer thread runs the request
    handler, which waits for the engine's sum and update, WaitToRead, before it takes the next request,
    kvstore_dist_server.h); the messages wait for that in arrival order, or by priority where one is given.
    Otherwise each thread takes the next message as soon as it is done with one (a worker's customer thread hands
    a reply to the engine and goes on)."""

    def __init__(self, cpu: SharedCpu, costs: ThreadCosts, team: int, nbytes_of: Callable, done: Callable,
                 priority_of: Callable | None = None, extra: Callable | None = None, blocking: bool = False) -> None:
        self._priority_of, self._done = priority_of, done
        self._blocking = blocking and len(costs.stages) > 2  # one thread after the reader blocks by itself
        self._waiting: list = []  # blocking: (priority, arrival, job) waiting to enter the threads after the first
        self._seq = itertools.count()
        self._inside = False
        self.threads: list[CpuThread] = []
        last = len(costs.stages) - 1
        for k, stage in enumerate(costs.stages):
            job_of = (lambda r: r.job) if k == 0 else (lambda job: job)  # the first stage serves _Read tokens
            finished = self._read if k == 0 else (lambda job, k=k: self._put(k + 1, job))
            if k < last:
                self.threads.append(CpuThread(cpu, lambda job, c=stage, of=job_of: c.of(nbytes_of(of(job))),
                                              finished, False))
                continue

            def whole(job, c=stage, of=job_of) -> float:  # its own, the update with the last push, the team's loop
                job = of(job)
                n = nbytes_of(job)
                return c.of(n) + (extra(job) if extra is not None else 0.0) + costs.team.of(n)

            target = _LastStage(cpu, team, lambda job, of=job_of: costs.team.of(nbytes_of(of(job))))
            self.threads.append(CpuThread(target, whole, self._read if k == 0 else self._finished,
                                          priority_of is not None))
        self._last = last

    def begin(self, job) -> _Read:
        token = _Read(job)
        self._put(0, token)
        return token

    def arrived(self, token: _Read) -> None:
        token.here = True
        if token.read:
            self._onward(token)

    def put(self, job) -> None:
        self.arrived(self.begin(job))

    def _read(self, token: _Read) -> None:
        token.read = True
        if token.here:
            self._onward(token)

    def _onward(self, token: _Read) -> None:
        if self._last == 0:
            self._done(token.job)
        elif not self._blocking:
            self._put(1, token.job)
        else:
            priority = self._priority_of(token.job) if self._priority_of is not None else 0
            heapq.heappush(self._waiting, (priority, next(self._seq), token.job))
            self._enter()

    def _enter(self) -> None:
        if not self._inside and self._waiting:
            self._inside = True
            self._put(1, heapq.heappop(self._waiting)[2])

    def _finished(self, job) -> None:
        self._done(job)
        if self._blocking:
            self._inside = False
            self._enter()

    def _put(self, k: int, job) -> None:
        if k == self._last and self._priority_of is not None:
            self.threads[k].put(self._priority_of(job.job if k == 0 else job), job)
        else:
            self.threads[k].put(0, job)
