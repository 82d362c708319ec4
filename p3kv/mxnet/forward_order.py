"""The forward order of a model's parameters, from which P3 takes each key's priority (paper: the first layer of
the forward pass is the most urgent). A state machine of plain Python: it sees array handles, not MXNet.
"""

from __future__ import annotations

import logging

log = logging.getLogger("p3kv.kvstore")


class ForwardOrder:
    """Each key's position in the forward pass, for Gluon, whose key numbers are alphabetical.

    Gluon blocks read every parameter through Parameter.data() as the forward pass reaches it (also when
    hybridized: the cached graph's inputs are in topological order). p3kv.mxnet.hook wraps Parameter.data to
    call `used()`, and autograd.record() to call `new_pass()`, on every order it watches (each kvstore 'p3'
    owns one and has it watched: hook.watch_forward_pass). The forward pass just before the first pushpull
    defines the order, whatever was read earlier: it starts where the last recording scope opened (without
    one, at the earliest of the keys' last reads), and each key ranks by its first read from there (a weight
    shared by two layers, e.g. a tied embedding and output layer, is needed by the first).
    Keys are matched to arrays through the `out` arrays of init/broadcast (the parameters' data). Module
    never calls Parameter.data; its keys are already numbered in forward order, so MXNet's priority hint
    (-index) is right there and is kept.
    """

    # Reads kept while the order is unknown. Only the last forward pass matters, so when a script reads
    # parameters for ever without pushing a key they stand for (inference loops, keys set up by init() with no
    # parameter array), the oldest reads are dropped: memory stays bounded and the most recent pass is kept.
    # A pass of more reads than this (several thousand parameters, each read a few times) ranks only its end.
    MAX_READS = 65536

    def __init__(self):
        self._uses: list[int] = []  # array handles in the order they were read, until the order is learned
        self._pass_start: int | None = None  # index into _uses where the last forward pass began
        self._handle_of: dict[int, int] = {}  # key index -> handle of its parameter array
        self.priority: dict[int, int] = {}
        self.learned = False

    def used(self, array) -> None:
        if not self.learned:
            self._uses.append(array.handle.value)
            if len(self._uses) > self.MAX_READS:
                self._forget(len(self._uses) - self.MAX_READS // 2)

    def _forget(self, n: int) -> None:
        """Drops the `n` oldest reads (amortised O(1) per read: half the window at a time)."""
        del self._uses[:n]
        if self._pass_start is not None:
            self._pass_start = max(0, self._pass_start - n)

    def new_pass(self) -> None:
        if not self.learned:
            self._pass_start = len(self._uses)

    def bind(self, index: int, array) -> None:
        """Remembers which parameter array a key stands for."""
        self._handle_of[index] = array.handle.value

    def learn(self) -> None:
        """Called before pushes: fixes priorities once the forward pass has read the keys' arrays."""
        if self.learned or not self._uses:
            return
        last = {h: i for i, h in enumerate(self._uses)}
        keyed = {h for h in self._handle_of.values() if h in last}
        if not keyed:
            return
        start = min(last[h] for h in keyed)  # where the last forward pass began, at the latest
        if self._pass_start is not None and self._pass_start <= start:
            start = self._pass_start
        first: dict[int, int] = {}
        for i in range(start, len(self._uses)):
            first.setdefault(self._uses[i], i)
        ranked = sorted((first[h], index) for index, h in self._handle_of.items() if h in first)
        # First layer first: priority 0 is the most urgent, then -1, -2, ...
        self.priority = {index: -rank for rank, (_, index) in enumerate(ranked)}
        self.learned = True
        self._uses, self._pass_start = [], None
        log.info("priorities from the forward pass (first layer first): keys %s", [i for _, i in ranked][:12])

    def of(self, index: int, hint: int) -> int:
        return self.priority.get(index, hint)
