"""Parameter-server systems: p3kv, its ablations, MXNet dist_sync and MXNet's built-in P3, as one model with a
few switches (how keys are cut and placed, send order, the sender's sockets, where the optimizer runs).

A worker runs forward layer 0..n-1 then backward n-1..0 on its virtual GPU (engine.Device). When layer k's
backward ends its parts are handed to the worker's sender. A part reaching its server is processed by the
server's threads (below; by priority where the system orders it), its CPU served by the server host's pool;
once all W pushes of a part were processed the server sends the aggregate to every worker (P3's broadcast, and
MXNet's pushpull, which answers each worker's ZPushPull request). A part coming back is processed by the
worker's receive threads (their CPU on the worker host's pool).

Which thread pays a message's CPU (`receivers`): MXNet's ps-lite reads every peer's messages through one chain of
threads per process (ZMQ's I/O thread, the van, the customer, the engine's worker with its OpenMP team): with
"process" a message passes the process's serial threads in turn, each paying its own measured CPU per message and
per byte, then the last one's OpenMP loop (stages.py; `server_threads` and `worker_threads`, fitted by threads.py on
the fit split's runs; None: one thread pays the loopback-fitted `costs` and `link_costs`, the model before the
measurement). p3kv's C++ core reads each peer's connection on a thread of its own
(ServerNode's ReceiveLoop per worker, WorkerNode's per server: cpp/src/server.cc, worker.cc) and hands the frame to
one consumer that only sums and updates: with "connection" a push costs its receive thread the transport's cost
less the sum (measured on the server's hot path, server_slice.csv) and the consumer the sum (and the update with
the last push), and a reply costs the receive thread of its server's connection. Where every thread may use a core
the split hardly matters; under the emulation's per-thread caps (one dilated CPU per thread) it decides how much of
a host's quota one server can use.
An array whose parts are all back is ready,
after its update where the workers run the optimizer: on the virtual GPU at its memory traffic (update_on
"workers-gpu": MXNet's P3 in the runs with GPU-side updates) or on the worker's CPU engine thread (update_on
"workers-cpu": those runs' predecessors). With update_on "servers" (p3kv, dist_sync) the update is CPU on the
server thread, with the last push of a part. Layer k's next forward starts once all its arrays are ready.
"""

from __future__ import annotations

import dataclasses
import statistics

from benchmarks.analysis.points import DEFAULTS
from benchmarks.emulation.thread_cap import omp_threads
from benchmarks.sim import sockets
from benchmarks.sim.cluster import Cluster, CpuCosts
from benchmarks.sim.engine import CpuThread, Device, EventLoop, FairNetwork, host_cpus
from benchmarks.sim.model import ModelProfile
from benchmarks.sim.stages import Stages, ThreadCosts

MXNET_BIGARRAY_BOUND = 1_000_000  # MXNET_KVSTORE_BIGARRAY_BOUND's default: larger arrays split over servers
SGD_ACCESSES = 5  # emulated_compute.SGD_MOMENTUM_ACCESSES: read weight, gradient, momentum; write two
COPY_ACCESSES = 2  # emulated_compute.COPY_ACCESSES: a device-to-device copy reads and writes each element once
UPDATE_PLACES = ("servers", "workers-gpu", "workers-cpu")
RECEIVERS = ("process", "connection")  # one receive thread per process (ps-lite) or per peer connection (p3kv)
# Probed on this kernel (sockets.py): a send socket's payload, the autotuned socket's bytes, and what one TCP
# connection under BBR has in flight. Every system here sends over such connections (p3kv's transport, ZMQ's).
SOCKET_PAYLOAD, AUTOTUNED_SOCKET_BYTES, FLIGHT_BYTES = sockets.probed()


@dataclasses.dataclass(frozen=True)
class PSSystem:
    name: str
    slice_size: int | None = None  # cut every array into slices of at most this many elements, round-robin
    big_array_bound: int | None = None  # MXNet: arrays above it split evenly over all servers, others on one
    priority: bool = False  # sender and server queues by (layer, arrival) instead of arrival
    window: int | None = 1  # messages a process has in its sockets at once (None: no limit; see sender.Sender)
    socket_bytes: float | None = None  # p3kv's sender instead: bytes per destination socket (sender.Sender)
    flight_bytes: float | None = FLIGHT_BYTES  # what one connection has in flight at most (TCP's window; None: none)
    split_bound: int | None = None  # without slices: arrays above it cut into one part per server (round-robin)
    update_on: str = "servers"  # where the optimizer runs: UPDATE_PLACES
    costs: CpuCosts = CpuCosts()  # a message's CPU where it is received (per message, per payload byte)
    update: CpuCosts = CpuCosts()  # the optimizer's CPU per part (servers) or array (workers-cpu); zero: none
    # The passes over each array on the virtual GPU when its result lands (0: none): workers-gpu, the update's;
    # servers, the copy of the new values into the parameter (p3kv.torch's server placement, torch_compute.py).
    gpu_accesses: int = 0
    # The passes over each array on the virtual GPU after its layer's backward, before its push (p3kv.torch's 1/W
    # scaling into its send buffer, emulation/gradient_work.py; 0: none, or the host made it, as before that).
    push_accesses: int = 0
    link_costs: CpuCosts = CpuCosts()  # extra receive CPU of the emulated links (veth, bridge, tc), fitted
    receivers: str = "process"  # RECEIVERS: which thread reads a message (the module doc)
    aggregate: CpuCosts = CpuCosts()  # receivers "connection": the consumer's sum per push, part of `costs`
    server_threads: ThreadCosts | None = None  # receivers "process": a push's CPU on the server's threads
    worker_threads: ThreadCosts | None = None  # ... and a reply's on the worker's (stages.py; None: one thread)

    def __post_init__(self) -> None:
        if self.update_on not in UPDATE_PLACES:
            raise ValueError(f"update_on {self.update_on!r}: one of {', '.join(UPDATE_PLACES)}")
        if self.receivers not in RECEIVERS:
            raise ValueError(f"receivers {self.receivers!r}: one of {', '.join(RECEIVERS)}")
        if (self.server_threads or self.worker_threads) and self.receivers != "process":
            raise ValueError("thread costs are for receivers 'process' (a thread per connection has no chain)")

    def with_costs(self, costs: CpuCosts, update: CpuCosts | None = None) -> PSSystem:
        return dataclasses.replace(self, costs=costs, update=self.update if update is None else update)


@dataclasses.dataclass(frozen=True)
class Part:
    layer: int
    nbytes: int
    server: int
    array: int = 0  # index of the array (forward order over the model) the part belongs to


def parts_of(model: ModelProfile, system: PSSystem, servers: int) -> list[Part]:
    """How the system cuts and places the model's arrays (forward order)."""
    parts, rr, key = [], 0, 0
    for k, layer in enumerate(model.layers):
        for n in layer.arrays:
            if system.slice_size:
                for start in range(0, n, system.slice_size):
                    size = min(system.slice_size, n - start)
                    parts.append(Part(k, size * layer.itemsize, rr % servers, key))
                    rr += 1
            elif system.split_bound is not None and n > system.split_bound:
                for s in range(servers):  # consecutive keys, so round-robin puts them on different servers
                    size = n // servers + (1 if s < n % servers else 0)
                    parts.append(Part(k, size * layer.itemsize, rr % servers, key))
                    rr += 1
            elif system.big_array_bound is not None and n > system.big_array_bound:
                for s in range(servers):  # even split, as MXNet's EncodeDefaultKey
                    size = n // servers + (1 if s < n % servers else 0)
                    parts.append(Part(k, size * layer.itemsize, s, key))
            elif system.big_array_bound is not None:
                parts.append(Part(k, n * layer.itemsize, (key * 9973) % servers, key))  # MXNet's small-key placement
            else:
                parts.append(Part(k, n * layer.itemsize, rr % servers, key))  # p3kv with one slice per array
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
    cpu_pct: float = 0.0  # CPU the simulated hosts used, % of one core (all hosts together, the whole run)


class PSRun:
    """One simulation; build it, then run()."""

    def __init__(self, model: ModelProfile, cluster: Cluster, system: PSSystem, iters: int = 4,
                 record: bool = False) -> None:
        self.model, self.cluster, self.system, self.iters = model, cluster, system, iters
        self.loop = loop = EventLoop()
        self.net = FairNetwork(loop, cluster, record)
        self.cpus = host_cpus(cluster, loop)
        W, S = cluster.workers, cluster.servers
        self.parts = parts_of(model, system, S)
        n = len(model.layers)
        self.array_layer = [k for k, layer in enumerate(model.layers) for _ in layer.arrays]
        self.array_size = [(e, layer.itemsize) for layer in model.layers for e in layer.arrays]
        self.layer_arrays = [len(layer.arrays) for layer in model.layers]
        self.array_parts = [0] * len(self.array_layer)
        self.first_part = [0] * (n + 1)  # parts are in forward order: layer k's are first_part[k]..[k+1]-1
        for p in self.parts:
            self.first_part[p.layer + 1] += 1
        for k in range(n):
            self.first_part[k + 1] += self.first_part[k]
        for p in self.parts:
            self.array_parts[p.array] += 1
        costs, link = system.costs, system.link_costs
        self.prio = [p.layer if system.priority else 0 for p in self.parts]
        self.part_host = [cluster.server_host(p.server) for p in self.parts]
        self.reply_cost = [costs.of(p.nbytes) + link.of(p.nbytes) for p in self.parts]
        per_connection = system.receivers == "connection"
        self.update_cost = [system.update.of(p.nbytes) if system.update_on == "servers" else 0.0 for p in self.parts]
        self.worker_hosts = [cluster.worker_host(w) for w in range(W)]
        if per_connection:  # the consumer per server; a thread per (server, worker) connection reads the pushes
            # A push's CPU on the consumer (the sum) and on the receive thread of the worker's connection (the rest).
            self.push_cost = [min(system.aggregate.of(p.nbytes), c) for p, c in zip(self.parts, self.reply_cost)]
            self.read_cost = [c - pushed for c, pushed in zip(self.reply_cost, self.push_cost)]
            self.server_threads = [CpuThread(self.cpus[cluster.server_host(s)], self._push_cost, self._pushed,
                                             system.priority) for s in range(S)]
            self.read_threads = [[CpuThread(self.cpus[cluster.server_host(s)], self._read_cost, self._read, False)
                                  for _ in range(W)] for s in range(S)]
            self.receive_threads = [[CpuThread(self.cpus[h], self._reply_cost, self._received, False)
                                     for _ in range(S)] for h in self.worker_hosts]  # one per server
        else:  # one chain of threads per process, with the OpenMP team the emulation gives each process
            cpus_per_host = cluster.cores / cluster.thread_cores if cluster.cores and cluster.thread_cores else None
            team = omp_threads(cpus_per_host, cluster.thread_cores)
            one = ThreadCosts((CpuCosts(costs.per_message + link.per_message, costs.per_byte + link.per_byte),))
            nbytes = [p.nbytes for p in self.parts]
            self.server_paths = [Stages(self.cpus[cluster.server_host(s)], system.server_threads or one, team,
                                        nbytes.__getitem__, self._pushed,
                                        self.prio.__getitem__ if system.priority else None, self._update_if_last,
                                        blocking=system.server_threads is not None)
                                 for s in range(S)]
            self.worker_paths = [Stages(self.cpus[h], system.worker_threads or one, team,
                                        lambda job: nbytes[job[0]], self._received) for h in self.worker_hosts]
        self.update_threads = [CpuThread(self.cpus[h], self._array_update_cost, self._updated, False)
                               for h in self.worker_hosts]
        sockets = (system.priority, system.window, system.socket_bytes, system.flight_bytes)
        self.worker_senders = [self.net.sender(h, *sockets) for h in self.worker_hosts]
        self.server_senders = [self.net.sender(cluster.server_host(s), *sockets) for s in range(S)]
        self.devices = [Device(loop, cluster.gpu_slack_s) for _ in range(W)]
        self.pushed = [0] * len(self.parts)
        self.got = [[0] * len(self.array_layer) for _ in range(W)]
        self.ready = [[0] * n for _ in range(W)]
        self.version = [[0] * n for _ in range(W)]
        self.op = [0] * W  # index into this iteration's 2n device ops
        self.iteration = [0] * W
        self.running = [False] * W  # the worker's own op (a layer) is on its device
        self.forward_done: list[list[float]] = [[] for _ in range(W)]

    # --- worker device ---
    def _advance(self, w: int) -> None:
        n = len(self.model.layers)
        if self.running[w] or self.iteration[w] >= self.iters:
            return
        j = self.op[w]
        if j < n:
            if self.version[w][j] < self.iteration[w]:
                return  # _layer_ready resumes us when layer j's parameters are back
            seconds, waited = self.model.layers[j].forward_s, True
        else:
            seconds, waited = self.model.layers[2 * n - 1 - j].backward_s, False
        self.running[w] = True
        self.devices[w].submit(seconds, waited, self._op_done, w)

    def _op_done(self, w: int) -> None:
        n = len(self.model.layers)
        j = self.op[w]
        self.running[w] = False
        if j == n - 1:
            self.forward_done[w].append(self.loop.now)
        if j >= n:
            k = 2 * n - 1 - j
            if self.system.push_accesses:  # on the device before the next layer (FIFO), then pushed
                seconds = sum(self.model.memory_seconds(e, self.model.layers[k].itemsize, self.system.push_accesses)
                              for e in self.model.layers[k].arrays)
                self.devices[w].submit(seconds, False, self._push_layer, w, k)
            else:
                self._push_layer(w, k)
        self.op[w] = j + 1
        if self.op[w] == 2 * n:
            self.op[w] = 0
            self.iteration[w] += 1
        self._advance(w)

    def _push_layer(self, w: int, k: int) -> None:
        sender, prio, host, parts = self.worker_senders[w], self.prio, self.part_host, self.parts
        streamed = self.system.receivers == "process"
        for i in range(self.first_part[k], self.first_part[k + 1]):
            if streamed:  # ps-lite's reader works on a push as it comes (stages.py)
                sender.put(prio[i], host[i], parts[i].nbytes, self._at_server, i, w, [], on_start=self._to_server)
            else:
                sender.put(prio[i], host[i], parts[i].nbytes, self._at_server, i, w)

    # --- server ---
    def _to_server(self, i: int, w: int, token: list) -> None:
        token.append(self.server_paths[self.parts[i].server].begin(i))

    def _at_server(self, t: float, i: int, w: int, token: list | None = None) -> None:
        if token is not None:
            self.server_paths[self.parts[i].server].arrived(token[0])
        else:
            self.read_threads[self.parts[i].server][w].put(0, i)  # its connection's thread reads it, then queues it

    def _read_cost(self, i: int) -> float:
        return self.read_cost[i]

    def _read(self, i: int) -> None:
        self.server_threads[self.parts[i].server].put(self.prio[i], i)

    def _push_cost(self, i: int) -> float:
        return self.push_cost[i] + self._update_if_last(i)

    def _update_if_last(self, i: int) -> float:
        last = self.pushed[i] == self.cluster.workers - 1  # the last push completes the aggregate: update with it
        return self.update_cost[i] if last else 0.0

    def _pushed(self, i: int) -> None:
        self.pushed[i] += 1
        if self.pushed[i] < self.cluster.workers:
            return
        self.pushed[i] = 0
        sender = self.server_senders[self.parts[i].server]
        for v, host in enumerate(self.worker_hosts):
            if self.system.receivers == "process":
                sender.put(self.prio[i], host, self.parts[i].nbytes, self._at_worker, i, v, [],
                           on_start=self._to_worker)
            else:
                sender.put(self.prio[i], host, self.parts[i].nbytes, self._at_worker, i, v)

    # --- worker receive ---
    def _to_worker(self, i: int, w: int, token: list) -> None:
        token.append(self.worker_paths[w].begin((i, w)))

    def _at_worker(self, t: float, i: int, w: int, token: list | None = None) -> None:
        if token is not None:
            self.worker_paths[w].arrived(token[0])
        else:
            self.receive_threads[w][self.parts[i].server].put(0, (i, w))

    def _reply_cost(self, job) -> float:
        return self.reply_cost[job[0]]

    def _received(self, job) -> None:
        i, w = job
        a = self.parts[i].array
        self.got[w][a] += 1
        if self.got[w][a] < self.array_parts[a]:
            return
        self.got[w][a] = 0
        system = self.system
        if system.update_on in ("workers-gpu", "servers") and system.gpu_accesses:
            elements, itemsize = self.array_size[a]
            self.devices[w].submit(self.model.memory_seconds(elements, itemsize, system.gpu_accesses), True,
                                   self._updated, (w, a))
        elif system.update_on == "workers-cpu":
            self.update_threads[w].put(0, (w, a))
        else:
            self._updated((w, a))

    def _array_update_cost(self, job) -> float:
        elements, itemsize = self.array_size[job[1]]
        return self.system.update.of(elements * itemsize)

    def _updated(self, job) -> None:
        w, a = job
        k = self.array_layer[a]
        self.ready[w][k] += 1
        if self.ready[w][k] == self.layer_arrays[k]:
            self.ready[w][k] = 0
            self.version[w][k] += 1
            if self.op[w] == k:
                self._advance(w)

    def run(self) -> Result:
        for w in range(self.cluster.workers):
            self.loop.at(0.0, self._advance, w)
        self.loop.run()
        end = self.loop.now
        used = sum(c.busy_core_s for c in {id(c): c for c in self.cpus}.values())
        return summarise(self.forward_done, self.model, self.cluster.workers, self.net.busy,
                         100 * used / end if end else 0.0)


def summarise(forward_done: list[list[float]], model: ModelProfile, workers: int, busy, cpu_pct: float = 0.0
              ) -> Result:
    """Iteration time: the mean interval between forward completions after the first (warm-up) iteration,
    median over workers (cluster_bench's rule, with fewer iterations)."""
    per_worker = []
    for times in forward_done:
        steady = times[1:] if len(times) > 2 else times
        per_worker.append((steady[-1] - steady[0]) / (len(steady) - 1) if len(steady) > 1 else steady[0])
    t = statistics.median(per_worker)
    return Result(t, workers * model.samples_per_batch / t, model.unit, forward_done, busy, cpu_pct)


# The systems under test. Costs are attached by costs.py (measured constants), settings by settings.py.
MXNET_P3_WATER_MARK = 10  # the messages ZMQ's pipe to one peer holds above its socket (DMLC_PS_WATER_MARK)


def socket_payload(p3_socket_buffer: float) -> float:
    return SOCKET_PAYLOAD * p3_socket_buffer


def mxnet_p3_socket(slice_size: int, itemsize: int = 4) -> float:
    """MXNet's P3 van (ps-lite p3_van.h): one thread sends the most urgent message and blocks while its peer's ZMQ
    pipe holds DMLC_PS_WATER_MARK messages (ZMQ_SNDHWM), whose I/O thread moves them into an autotuned socket."""
    return MXNET_P3_WATER_MARK * slice_size * itemsize + AUTOTUNED_SOCKET_BYTES  # float32 gradients


P3_SOCKET_BYTES = socket_payload(float(DEFAULTS["p3"]["P3_SOCKET_BUFFER"]))
P3KV = PSSystem("p3", slice_size=50_000, priority=True, receivers="connection",
                socket_bytes=P3_SOCKET_BYTES)
SLICING_ONLY = PSSystem("p3-slicing-only", slice_size=50_000, priority=False, receivers="connection",
                        socket_bytes=P3_SOCKET_BYTES)
PRIORITY_ONLY = PSSystem("p3-priority-only", slice_size=None, priority=True, receivers="connection",
                         socket_bytes=P3_SOCKET_BYTES)
# The fair priority-only ablation (cluster_worker --split-big-arrays SERVERS): no slices, arrays above 10^6
# elements cut into one key per server.
PRIORITY_SPLIT = PSSystem("p3-priority-split", slice_size=None, priority=True, split_bound=MXNET_BIGARRAY_BOUND,
                          receivers="connection", socket_bytes=P3_SOCKET_BYTES)
# MXNet 1.9's kv.pushpull is one ps-lite ZPushPull request per part (kvstore_dist.h PushPullDefault; P3StoreDist
# one per slice): the server answers every worker's request with the aggregate as soon as it has all of them, so
# no ack and no pull round trip: the same traffic as P3's broadcast. ZMQ: a socket per peer, no send limit; each
# socket a TCP connection under the same BBR as p3kv's, so the same probed window caps what it has in flight.
DIST_SYNC = PSSystem("dist_sync", big_array_bound=MXNET_BIGARRAY_BOUND, priority=False, window=None)
# MXNet's P3 van: a priority queue and a send thread in front of ZMQ sockets with DMLC_PS_WATER_MARK=10.
MXNET_P3 = PSSystem("mxnet-p3", slice_size=40_000, priority=True, window=None, socket_bytes=mxnet_p3_socket(40_000),
                    update_on="workers-gpu", gpu_accesses=SGD_ACCESSES)
# p3kv.torch runs p3kv's C++ transport: the same slices, priorities and sender; its worker placement updates each
# parameter on the virtual GPU as its slices land (torch_compute.VirtualGpuSGD), its server placement on the servers
# (the new values then copied into the parameter on the virtual GPU: torch_compute.copy_weights_on_the_virtual_gpu).
TORCH_P3KV = PSSystem("torch-p3kv", slice_size=50_000, priority=True, update_on="workers-gpu",
                      gpu_accesses=SGD_ACCESSES, push_accesses=COPY_ACCESSES, receivers="connection",
                      socket_bytes=P3_SOCKET_BYTES)
TORCH_P3KV_SERVER = PSSystem("torch-p3kv-server", slice_size=50_000, priority=True, receivers="connection",
                             gpu_accesses=COPY_ACCESSES, push_accesses=COPY_ACCESSES,
                             socket_bytes=P3_SOCKET_BYTES)
SYSTEMS = {s.name: s for s in (P3KV, SLICING_ONLY, PRIORITY_ONLY, PRIORITY_SPLIT, DIST_SYNC, MXNET_P3, TORCH_P3KV,
                               TORCH_P3KV_SERVER)}


def simulate(model: ModelProfile, cluster: Cluster, system: PSSystem, iters: int = 4, record: bool = False) -> Result:
    return PSRun(model, cluster, system, iters, record).run()
