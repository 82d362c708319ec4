"""What one process puts on the network (engine.FairNetwork carries it): its send queue and its sockets' rules."""

from __future__ import annotations

import heapq
import itertools
import operator
from collections import deque
from typing import Any

_RANK = operator.itemgetter(0, 1)  # a frame's (priority, seq): its rank among the node's frames


class Sender:
    """What one process puts on the network: a queue (by priority or arrival) in front of its sockets.

    Two kinds (the sender's own rule decides which messages are on the links at once):
    - `window`: at most that many messages admitted to the sockets (None: no limit), each released when its sender
      has sent it; admitted messages to one destination go one after another (one TCP connection), to different
      destinations at once. dist_sync's ZMQ (window None): a socket per destination, all sending at once.
    - `socket_bytes` (p3kv's sender, cpp/src/sender.h; MXNet's P3 van over its ZMQ pipes, ps.mxnet_p3_socket):
      each destination's socket holds at most that many bytes
      not yet delivered (TCP frees send-buffer bytes only when the receiver has them), and one thread writes the
      node's most urgent frame, holding every other destination back while that frame's socket is full (the
      priority hold); a frame being written to one destination is finished before the next frame to it, and a
      more urgent frame to another destination goes in between. Frames are written and delivered in chunks of
      half the buffer, so a frame larger than the buffer streams through it.
    """

    def __init__(self, net: Any, host: int, prioritised: bool, window: int | None,
                 socket_bytes: float | None = None, flight_bytes: float | None = None) -> None:
        self.net, self.host = net, host  # net: the engine.FairNetwork that made it (engine imports this module)
        self.flight_bytes = flight_bytes  # what one connection may have in flight (None: no cap)
        self._prioritised, self._window = prioritised, window
        self._queue: list | deque = [] if prioritised or socket_bytes else deque()  # socket_bytes: by (0, seq)
        self._seq = itertools.count()
        self._admitted = 0
        self._socket_bytes = socket_bytes
        self._chunk = socket_bytes / 2 if socket_bytes else 0.0
        self._undelivered: dict[int, float] = {}  # socket_bytes: per destination, bytes written and not delivered
        self._writing: dict[int, list] = {}  # socket_bytes: per destination, [priority, seq, message, bytes left]
        self.id = next(net._ids)

    def put(self, priority: int, dst: int, nbytes: float, on_arrival, *args, on_start=None) -> None:
        """on_arrival(t, *args) at the receiver once the message is there (at once on the same host); on_start(*args),
        where given, when its first byte leaves (a receiver that reads as the bytes come: stages.py)."""
        if dst == self.host:
            if on_start is not None:
                on_start(*args)
            on_arrival(self.net.loop.now, *args)
            return
        message = (dst, nbytes, on_arrival, args, on_start)
        if self._socket_bytes:
            heapq.heappush(self._queue, (priority if self._prioritised else 0, next(self._seq), message))
            self._write()
        elif self._window is None or (self._admitted < self._window and not self._queue):
            self._admit(message)
        elif self._prioritised:
            heapq.heappush(self._queue, (priority, next(self._seq), message))
        else:
            self._queue.append(message)

    def _admit(self, message) -> None:
        self._admitted += 1
        self.net._enqueue(self, message)

    def _sent(self) -> None:
        if self._socket_bytes:
            return  # its socket's bytes are freed on delivery (_delivered)
        self._admitted -= 1
        while self._queue and (self._window is None or self._admitted < self._window):
            self._admit(heapq.heappop(self._queue)[2] if self._prioritised else self._queue.popleft())

    def _most_urgent(self) -> list | None:
        """The frame the thread writes next: the most urgent queued or partly written one; a queued frame whose
        destination has one partly written waits behind it (that one inherits its rank)."""
        writing = min(self._writing.values(), key=_RANK) if self._writing else None
        if self._queue and (writing is None or self._queue[0][:2] < (writing[0], writing[1])):
            priority, seq, message = self._queue[0]
            if message[0] in self._writing:
                return self._writing[message[0]]
            return [priority, seq, message, message[1]]
        return writing

    def _write(self) -> None:
        while True:
            frame = self._most_urgent()
            if frame is None:
                return
            priority, seq, message, left = frame
            dst = message[0]
            chunk = min(left, self._chunk)
            held = self._undelivered.get(dst, 0.0)
            if held and held + chunk > self._socket_bytes:
                return  # its socket is full: the thread waits for it, and so does every other destination
            first = left == message[1]
            if first:  # a new frame: out of the queue, its first chunk goes now
                heapq.heappop(self._queue)
                self._writing[dst] = frame
            frame[3] = left = left - chunk
            self._undelivered[dst] = held + chunk
            last = left <= 0
            if last:
                del self._writing[dst]
            started = self._started if first and message[4] is not None else None
            self.net._enqueue(self, (dst, chunk, self._delivered, (dst, chunk, last, message), started))

    @staticmethod
    def _started(dst: int, chunk: float, last: bool, message) -> None:
        _, _, _, args, on_start = message
        on_start(*args)

    def _delivered(self, t: float, dst: int, chunk: float, last: bool, message) -> None:
        self._undelivered[dst] -= chunk  # its ACK's way back is not modelled (BBR keeps the queues short)
        if last:
            _, _, on_arrival, args, _ = message
            on_arrival(t, *args)
        self._write()
