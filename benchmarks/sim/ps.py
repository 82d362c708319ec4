"""Parameter-server systems: p3kv, its two ablations, MXNet dist_sync and MXNet's built-in P3, as one model with
five switches (how keys are cut and placed, send order, the sender's committed window, and whether the server
answers with the aggregate at once or acks and waits for pull requests).

A worker runs forward layer 0..n-1 then backward n-1..0 on one serial device (a GPU stream). When layer k's
backward ends its parts are pushed; layer k's next forward waits until every part of layer k is back. A server
part is aggregated once all W pushes of it were processed by the server's one consumer thread, then sent to
every worker (P3's broadcast, and MXNet's pushpull, which answers each worker's ZPushPull request), or, with
broadcast=False, acknowledged, after which each worker sends a pull request and gets the part (MXNet's separate
push and pull calls, which none of the benchmarks uses). CPU: a pushed part costs its CPU on the server thread,
a part coming back costs it on the receiving host's cores, control messages (ack, pull request) cost one
per-message charge each. The optimizer's update of a part costs `update` once on the server thread, with the
last push of it (update_on "servers": p3kv, dist_sync), or on every worker's cores when the part comes back
(update_on "workers": MXNet's P3, whose servers refuse the optimizer).
"""

from __future__ import annotations

import dataclasses
import statistics

from benchmarks.sim.cluster import Cluster, CpuCosts
from benchmarks.sim.engine import CpuPool, EventLoop, Network, Server
from benchmarks.sim.model import ModelProfile

CONTROL_BYTES = 64  # an ack or pull request: a header and no payload (ps-lite meta, about this size)
MXNET_BIGARRAY_BOUND = 1_000_000  # MXNET_KVSTORE_BIGARRAY_BOUND's default: larger arrays split over servers


@dataclasses.dataclass(frozen=True)
class PSSystem:
    name: str
    slice_size: int | None = None  # cut every array into slices of at most this many elements, round-robin
    big_array_bound: int | None = None  # MXNet: arrays above it split evenly over all servers, others on one
    priority: bool = False  # sender and server queues by (layer, arrival) instead of arrival
    broadcast: bool = True  # the server sends the aggregated part at once; else ack + pull request + response
    window: int = 1  # messages committed to the socket ahead of the sender's priority queue (see engine.Server)
    split_bound: int | None = None  # without slices: arrays above it cut into one part per server (round-robin)
    update_on: str = "servers"  # where the optimizer runs: "servers" or "workers"
    costs: CpuCosts = CpuCosts()
    update: CpuCosts = CpuCosts()  # the optimizer's CPU per part (zero: the servers only sum)

    def with_costs(self, costs: CpuCosts, update: CpuCosts | None = None) -> PSSystem:
        return dataclasses.replace(self, costs=costs, update=self.update if update is None else update)


@dataclasses.dataclass(frozen=True)
class Part:
    layer: int
    nbytes: int
    server: int


def parts_of(model: ModelProfile, system: PSSystem, servers: int) -> list[Part]:
    """How the system cuts and places the model's arrays (forward order)."""
    parts, rr, key = [], 0, 0
    for k, layer in enumerate(model.layers):
        for n in layer.arrays:
            if system.slice_size:
                for start in range(0, n, system.slice_size):
                    size = min(system.slice_size, n - start)
                    parts.append(Part(k, size * layer.itemsize, rr % servers))
                    rr += 1
            elif system.split_bound is not None and n > system.split_bound:
                for s in range(servers):  # consecutive keys, so round-robin puts them on different servers
                    size = n // servers + (1 if s < n % servers else 0)
                    parts.append(Part(k, size * layer.itemsize, rr % servers))
                    rr += 1
            elif system.big_array_bound is not None and n > system.big_array_bound:
                for s in range(servers):  # even split, as MXNet's EncodeDefaultKey
                    size = n // servers + (1 if s < n % servers else 0)
                    parts.append(Part(k, size * layer.itemsize, s))
            elif system.big_array_bound is not None:
                parts.append(Part(k, n * layer.itemsize, (key * 9973) % servers))  # MXNet's small-key placement
            else:
                parts.append(Part(k, n * layer.itemsize, rr % servers))  # p3kv with one slice per array
                rr += 1
            key += 1
    return parts


@dataclasses.dataclass
class Result:
    iteration_s: float
    throughput: float
    unit: str
    forward_done: list[list[float]]  # per worker, the time each iteration's forward completed
    busy: dict | None  # link -> [(start, end, bytes)] when recorded


class PSRun:
    """One simulation; build it, then run()."""

    def __init__(self, model: ModelProfile, cluster: Cluster, system: PSSystem, iters: int = 4,
                 record: bool = False) -> None:
        self.model, self.cluster, self.system, self.iters = model, cluster, system, iters
        self.loop = EventLoop()
        self.net = Network(self.loop, cluster, system.priority, record, system.window)
        shared = CpuPool(cluster.shared_cores) if cluster.shared_cores else None
        self.cpu = [shared or CpuPool(cluster.cores) for _ in range(cluster.hosts)]
        W, S = cluster.workers, cluster.servers
        self.parts = parts_of(model, system, S)
        n = len(model.layers)
        self.layer_parts: list[list[int]] = [[] for _ in range(n)]
        for i, p in enumerate(self.parts):
            self.layer_parts[p.layer].append(i)
        self.nparts = [len(ids) for ids in self.layer_parts]
        self.threads = [Server(self.loop, self._serve, self._served, system.priority) for _ in range(S)]
        # Per part, computed once (the hot paths run per message): priority, hosts, CPU of push and reply.
        costs = system.costs
        self.prio = [p.layer if system.priority else 0 for p in self.parts]
        self.part_host = [cluster.server_host(p.server) for p in self.parts]
        self.part_thread = [self.threads[p.server] for p in self.parts]
        self.push_cost = [costs.of(p.nbytes) for p in self.parts]
        on_servers = system.update_on == "servers"
        self.update_cost = [system.update.of(p.nbytes) if on_servers else 0.0 for p in self.parts]
        reply_bytes = [p.nbytes if system.broadcast else CONTROL_BYTES for p in self.parts]
        self.reply_bytes = reply_bytes
        self.reply_cost = [costs.of(b) if b > CONTROL_BYTES else costs.per_message for b in reply_bytes]
        if not on_servers:  # each worker updates the part it got back before its layer may run
            self.reply_cost = [c + system.update.of(p.nbytes) for c, p in zip(self.reply_cost, self.parts)]
        self.worker_hosts = [cluster.worker_host(w) for w in range(W)]
        self.pushed = [0] * len(self.parts)
        self.received = [[0] * n for _ in range(W)]
        self.version = [[0] * n for _ in range(W)]
        self.op = [0] * W  # index into this iteration's 2n device ops
        self.iteration = [0] * W
        self.device_busy = [False] * W
        self.forward_done: list[list[float]] = [[] for _ in range(W)]

    # --- worker device ---
    def _advance(self, w: int) -> None:
        n = len(self.model.layers)
        if self.device_busy[w] or self.iteration[w] >= self.iters:
            return
        j = self.op[w]
        if j < n:
            if self.version[w][j] < self.iteration[w]:
                return  # _deliver resumes us when layer j's parameters are back
            seconds = self.model.layers[j].forward_s
        else:
            seconds = self.model.layers[2 * n - 1 - j].backward_s
        self.device_busy[w] = True
        self.loop.at(self.loop.now + seconds, self._op_done, w)

    def _op_done(self, w: int) -> None:
        n = len(self.model.layers)
        j = self.op[w]
        self.device_busy[w] = False
        if j == n - 1:
            self.forward_done[w].append(self.loop.now)
        if j >= n:
            k = 2 * n - 1 - j
            src = self.worker_hosts[w]
            send, prio, host, at_server = self.net.send, self.prio, self.part_host, self._at_server
            for i in self.layer_parts[k]:
                send(src, host[i], self.parts[i].nbytes, prio[i], at_server, ("push", i, w))
        self.op[w] = j + 1
        if self.op[w] == 2 * n:
            self.op[w] = 0
            self.iteration[w] += 1
        self._advance(w)

    # --- server ---
    def _at_server(self, t: float, job) -> None:
        i = job[1]
        self.part_thread[i].put(self.prio[i], job)

    def _serve(self, job, now: float) -> float:
        kind, i, _ = job
        if kind == "push":  # the last push of a part completes its aggregate: the update runs with it
            cost = self.push_cost[i] + (self.update_cost[i] if self.pushed[i] == self.cluster.workers - 1 else 0.0)
        else:
            cost = self.system.costs.per_message
        if cost <= 0:
            return 0.0
        return self.cpu[self.part_host[i]].acquire(now, cost) - now

    def _served(self, job, now: float) -> None:
        kind, i, w = job
        src = self.part_host[i]
        if kind == "pull":
            self._reply(src, i, w, self.parts[i].nbytes, self._deliver)
            return
        self.pushed[i] += 1
        if self.pushed[i] < self.cluster.workers:
            return
        self.pushed[i] = 0
        nbytes, then = self.reply_bytes[i], (self._deliver if self.system.broadcast else self._acked)
        for v in range(self.cluster.workers):
            self._reply(src, i, v, nbytes, then)

    def _reply(self, src: int, i: int, w: int, nbytes: int, then) -> None:
        if nbytes == self.reply_bytes[i]:
            cost = self.reply_cost[i]
        else:
            cost = self.system.costs.of(nbytes) if nbytes > CONTROL_BYTES else self.system.costs.per_message
        dst = self.worker_hosts[w]
        self.net.send(src, dst, nbytes, self.prio[i], self._arrived, dst, cost, then, i, w)

    def _arrived(self, t: float, dst: int, cost: float, then, i: int, w: int) -> None:
        end = self.cpu[dst].acquire(t, cost) if cost > 0 else t
        if end > t:
            self.loop.at(end, then, i, w)
        else:
            then(i, w)

    # --- worker receive ---
    def _acked(self, i: int, w: int) -> None:
        self.net.send(self.worker_hosts[w], self.part_host[i], CONTROL_BYTES, self.prio[i], self._at_server,
                      ("pull", i, w))

    def _deliver(self, i: int, w: int) -> None:
        k = self.parts[i].layer
        self.received[w][k] += 1
        if self.received[w][k] == self.nparts[k]:
            self.received[w][k] = 0
            self.version[w][k] += 1
            if self.op[w] == k:
                self._advance(w)

    def run(self) -> Result:
        for w in range(self.cluster.workers):
            self.loop.at(0.0, self._advance, w)
        self.loop.run()
        return summarise(self.forward_done, self.model, self.cluster.workers, self.net.busy)


def summarise(forward_done: list[list[float]], model: ModelProfile, workers: int, busy) -> Result:
    """Iteration time: the mean interval between forward completions after the first (warm-up) iteration,
    median over workers (cluster_bench's rule, with fewer iterations)."""
    per_worker = []
    for times in forward_done:
        steady = times[1:] if len(times) > 2 else times
        per_worker.append((steady[-1] - steady[0]) / (len(steady) - 1) if len(steady) > 1 else steady[0])
    t = statistics.median(per_worker)
    return Result(t, workers * model.samples_per_batch / t, model.unit, forward_done, busy)


# The systems under test. Costs are attached by costs.py (measured constants).
P3KV = PSSystem("p3", slice_size=50_000, priority=True)
SLICING_ONLY = PSSystem("p3-slicing-only", slice_size=50_000, priority=False)
PRIORITY_ONLY = PSSystem("p3-priority-only", slice_size=None, priority=True)
# The fair priority-only ablation (cluster_worker --split-big-arrays SERVERS): no slices, arrays above 10^6
# elements cut into one key per server.
PRIORITY_SPLIT = PSSystem("p3-priority-split", slice_size=None, priority=True, split_bound=MXNET_BIGARRAY_BOUND)
# MXNet 1.9's kv.pushpull is one ps-lite ZPushPull request per part (kvstore_dist.h PushPullDefault; P3StoreDist
# one per slice): the server answers every worker's request with the aggregate as soon as it has all of them, so
# no ack and no pull round trip: the same traffic as P3's broadcast. What the benchmarks run (cluster_worker.py,
# kvstore_bench.py) is pushpull; with an optimizer, MXNet's servers update each part (update_on "servers").
DIST_SYNC = PSSystem("dist_sync", big_array_bound=MXNET_BIGARRAY_BOUND, priority=False, broadcast=True)
# MXNet's P3 van: a priority queue and a send thread in front of a ZMQ socket with DMLC_PS_WATER_MARK=10.
MXNET_P3 = PSSystem("mxnet-p3", slice_size=40_000, priority=True, broadcast=True, window=10, update_on="workers")
SYSTEMS = {s.name: s for s in (P3KV, SLICING_ONLY, PRIORITY_ONLY, PRIORITY_SPLIT, DIST_SYNC, MXNET_P3)}


def simulate(model: ModelProfile, cluster: Cluster, system: PSSystem, iters: int = 4, record: bool = False) -> Result:
    return PSRun(model, cluster, system, iters, record).run()
