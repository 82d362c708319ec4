"""The forward order of a torch model's modules, from which P3 takes each parameter's priority (paper: the first
layer of the forward pass is the most urgent). Registration order (`model.parameters()`) is not forward order: a
model may register its layers in any order and call them in another.
"""

from __future__ import annotations

import logging

log = logging.getLogger("p3kv.torch")


class ForwardOrder:
    """Learns the order in which a model's modules start their forward pass, from forward pre-hooks in the first
    forward pass of the root module, then gives each key its priority: the k-th key needed is priority -k
    (larger is more urgent, as in MXNet and p3kv.core; the first layer's keys are 0).

    `owners[key]` are the modules a key belongs to (a parameter tied between two modules belongs to both and
    ranks by the first of them to run). Keys of modules that did not run in the learned pass rank last.
    """

    def __init__(self, owners: dict[str, list]):
        self._owners = owners
        self._seen: dict[int, int] = {}  # id(module) -> position in the pass
        self._recording = False
        self.learned = False
        self.priority: dict[str, int] = {}
        self.ran: set[int] = set()  # ids of the modules that ran in the learned pass

    def start_pass(self) -> None:
        if not self.learned:
            self._recording = True
            self._seen.clear()

    def module_starts(self, module) -> None:
        if self._recording:
            self._seen.setdefault(id(module), len(self._seen))

    def end_pass(self) -> None:
        """Fixes the priorities after the first forward pass of the root module (before its backward pass)."""
        if self.learned or not self._recording:
            return
        self._recording = False
        never = len(self._seen)
        first = {key: min((self._seen.get(id(m), never) for m in mods), default=never)
                 for key, mods in self._owners.items()}
        ranked = sorted(first, key=lambda k: first[k])  # stable: registration order within one module
        self.priority = {key: -rank for rank, key in enumerate(ranked)}
        self.ran = set(self._seen)
        self.learned = True
        log.info("priorities from the forward pass (first layer first): %s", ranked[:12])

    def of(self, key: str) -> int:
        return self.priority.get(key, 0)
