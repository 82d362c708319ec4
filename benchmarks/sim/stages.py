"""A received message's CPU through a process's threads in turn: the serial threads it passes, then an OpenMP team.

ps-lite's receive path is not one thread. A message is read by ZMQ's I/O thread, handed through the van and the
customer to MXNet's engine, whose worker thread runs the copy and the sum with OpenMP. Under the emulation's
per-thread caps (one dilated CPU per thread) what limits such a process is its busiest thread, not the sum of its
threads' work, so charging everything to one thread (the model before this) made dist_sync and MXNet's P3 two
to three times too slow at VGG-19. The shares are measured, not assumed: each capped run records the busiest
threads of each role's busiest process (benchmarks/emulation/thread_usage.py, the rows' thread_cpu), and
threads.py turns the fit split's rows into shares. Stage k pays `shares[k]` of a message's cost; what the shares
leave is an OpenMP loop at the end of the last stage, split evenly over `team` threads (the last stage's thread
among them, as the team's master), the message done when the last of them ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from benchmarks.sim.engine import CpuThread, SharedCpu


class TeamCpu:
    """An engine thread whose every job ends with an OpenMP loop: `serial` of a job's cost on the thread alone,
    then the rest split evenly over `team` threads (itself among them) on `cpu`; done when the last one ends."""

    def __init__(self, cpu: SharedCpu, team: int, serial: float) -> None:
        if team < 1 or not 0.0 <= serial <= 1.0:
            raise ValueError(f"an OpenMP team of {team} threads with a serial share of {serial}")
        self.cpu, self.team, self.serial = cpu, team, serial

    def run(self, cost: float, done, *args) -> None:
        first = cost * self.serial
        chunk = (cost - first) / self.team
        left = [self.team]

        def one() -> None:
            left[0] -= 1
            if left[0] == 0:
                done(*args)

        def loop() -> None:
            for _ in range(self.team):
                self.cpu.run(chunk, one)

        self.cpu.run(first, loop)


class Stages:
    """Serial threads on `cpu` that a job passes in turn, stage k paying `shares[k]` of `cost_of(job)`; the rest
    (1 - sum of shares) is the last stage's OpenMP loop over `team` threads, and `extra(job)` (an update with the
    last push) is the last stage's too. Stages before the last serve in arrival order; the last by
    `priority_of(job)` where one is given. `done(job)` when the last stage ends. No shares: one thread pays it all."""

    def __init__(self, cpu: SharedCpu, shares: Sequence[float], team: int, cost_of: Callable, done: Callable,
                 priority_of: Callable | None = None, extra: Callable | None = None) -> None:
        shares = tuple(shares) or (1.0,)
        if any(s <= 0 for s in shares) or sum(shares) > 1.0 + 1e-9:
            raise ValueError(f"stage shares {shares}: each positive, together at most 1")
        rest = max(0.0, 1.0 - sum(shares))
        self._priority_of = priority_of
        self.threads: list[CpuThread] = []
        last = len(shares) - 1
        for k, share in enumerate(shares):
            if k < last:
                self.threads.append(CpuThread(cpu, lambda job, f=share: f * cost_of(job),
                                              lambda job, k=k: self._put(k + 1, job), False))
                continue
            whole = share + rest
            target = TeamCpu(cpu, team, share / whole) if rest > 0 and team > 1 else cpu
            self.threads.append(CpuThread(
                target, lambda job, f=whole: f * cost_of(job) + (extra(job) if extra is not None else 0.0), done,
                priority_of is not None))

    def put(self, job) -> None:
        self._put(0, job)

    def _put(self, k: int, job) -> None:
        last = k == len(self.threads) - 1
        self.threads[k].put(self._priority_of(job) if last and self._priority_of is not None else 0, job)
