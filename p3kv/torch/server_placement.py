"""Server placement's engine (the paper's): the optimizer runs on the servers, per slice, with native kernels
that follow torch's formulas (p3kv.torch.server_optimizer says which); workers push gradients and get back
parameters.

Same keys, priorities, hooks and accumulation as worker placement (p3kv.torch.synchronizer, which this extends);
what differs:
- At distribute, worker 0 sends the kernel spec its optimizer maps to and each key's lr and weight decay; the
  servers hold the weights from worker 0's parameters on (as MXNet's update_on_kvstore).
- A push is an update: the servers sum the gradients (each multiplied by 1/world size first, as DDP), run the
  kernel on each slice and broadcast the new values, which land in the slot's receive buffer. `optimizer.step()`
  returns at once; the new values are copied into a parameter when the module reading it starts its next forward
  (or at finish_all), so the next forward overlaps the last layers' communication.
- param_groups changes (LR schedulers, edits of lr, weight_decay, momentum, betas, ...) are looked for when an
  iteration's first gradient leaves: worker 0 then waits for every result of the previous iteration (so every
  server has finished it) and sends the new values before its own pushes, which the servers need for any update
  of the new iteration; the other workers need not wait. A change between backward() and step() comes too late
  (the servers update during backward) and is refused at step(), as are gradients changed in place after
  backward() sent them (clip_grad_norm_, GradScaler's unscale_), detected by the gradient's version counter.
- optimizer.state_dict() gathers every slice's state from the servers and joins them per parameter, in torch's
  format; load_state_dict() cuts a state into slices and sends each to its server. Between the two the workers'
  optimizer keeps no state (optimizer.state is empty).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import torch

from p3kv.core import requests
from p3kv.core.errors import ConfigError, P3Error, UnsupportedRequest
from p3kv.core.keys import key_id
from p3kv.torch import server_optimizer as so
from p3kv.torch import tensors
from p3kv.torch.synchronizer import Synchronizer, _Slot

log = logging.getLogger("p3kv.torch")


class ServerSynchronizer(Synchronizer):
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, worker, spec: dict, **kwargs):
        self.spec = spec
        self._sent = so.snapshot(optimizer)  # the param_groups' values the servers have
        self._round_open = False  # a gradient left since the last step()
        self._pushed_grads: dict[_Slot, tuple[torch.Tensor, int]] = {}  # the .grad each push read, and its version
        super().__init__(model, optimizer, worker, **kwargs)

    # -- set-up ---------------------------------------------------------------------------------------------
    def _init_keys(self) -> None:
        super()._init_keys()
        if self.worker.rank == 0:
            body = json.dumps({"spec": self.spec, "keys": self._key_hyperparameters(), "counts": {}}).encode()
            for s in range(self.worker.num_servers):
                self._request(s, requests.NATIVE_SET_OPTIMIZER, body)
        if self.optimizer.state:  # a state loaded before distribute(): it continues on the servers
            self._send_states()

    def _install_hooks(self) -> None:
        super()._install_hooks()
        self._handles.append(self.model.register_load_state_dict_post_hook(self._model_loaded))

    def _model_loaded(self, module, incompatible) -> None:
        raise ConfigError("model.load_state_dict() after p3kv.torch.distribute(placement='server'): the servers hold "
                          "the weights from distribute() on and would not see the loaded values; load the model's "
                          "state before distribute(), or use placement='worker'")

    def _key_hyperparameters(self) -> dict:
        groups = [so.group_hyperparameters(g) for g in self.optimizer.param_groups]
        return {str(key_id(slot.key)): groups[slot.group] for slot in self.slots.values()}

    def _request(self, server: int, kind: int, body: bytes) -> bytes:
        try:
            return self.worker.request(server, kind, body)
        except UnsupportedRequest as e:
            raise P3Error(f"{e}. placement='server' needs servers with the framework-free optimizer host: start "
                          "them with `python -m p3kv.core.server` (python -m p3kv.launch --servers core) or "
                          "p3kv.mxnet.server (the launcher's default), or use placement='worker'") from None

    # -- backward -------------------------------------------------------------------------------------------
    def _push(self, slot: _Slot, grad: torch.Tensor | None) -> None:
        if slot.in_round:
            raise P3Error(f"{slot.key[6:]} got a second gradient before optimizer.step(): with placement='server' "
                          "each synchronized backward pass is an update on the servers. Call step() after each "
                          "(accumulate with model.no_sync() or backward_passes_per_step); a skipped step() (e.g. "
                          f"GradScaler after an inf) cannot be undone on the servers: {so.WORKER_HINT}")
        if not self._round_open:
            self._round_open = True
            self._send_hyperparameters()
        super()._push(slot, grad)
        if grad is not None:
            self._pushed_grads[slot] = (grad, grad._version)

    def _send_hyperparameters(self) -> None:
        """Before an iteration's first push: param_groups changed since the servers got them go to the servers."""
        now = so.snapshot(self.optimizer)
        if now == self._sent:
            return
        spec = so.kernel_spec(self.optimizer)  # every worker refuses what the servers cannot run
        if self.worker.rank == 0:
            # Every result of the previous iteration here means every server has updated every slice of it.
            self._finish([slot for slot in self.slots.values() if slot.pushed])
            msg: dict = {"keys": self._key_hyperparameters()}
            if spec != self.spec:
                msg["spec"] = spec
            body = json.dumps(msg).encode()
            for s in range(self.worker.num_servers):
                self._request(s, requests.NATIVE_SET_HYPERPARAMETERS, body)
            log.info("optimizer hyperparameters changed: sent to the servers")
        self.spec, self._sent = spec, now

    # -- step -----------------------------------------------------------------------------------------------
    def request_step(self) -> None:
        """step(): the servers have updated (or are updating) from this iteration's pushes; each parameter takes
        its new value when its module next runs forward (or at finish_all)."""
        if getattr(self.optimizer, "grad_scale", None) is not None or \
                getattr(self.optimizer, "found_inf", None) is not None:
            raise ConfigError("GradScaler.step(optimizer): the servers updated from the scaled gradients backward() "
                              "sent, and cannot unscale them or skip a step after an inf; with placement='server' "
                              "train without GradScaler (float32 on the CPU needs none), or use placement='worker'")
        self.check_round()
        changed = [s.key[6:] for s, (g, version) in self._pushed_grads.items()
                   if s.param.grad is not g or g._version != version]
        if changed:
            raise ConfigError(f"the gradient of {', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''} changed "
                              "after backward() sent it (torch.nn.utils.clip_grad_norm_, GradScaler's unscale_, or "
                              "another change between backward() and step()): with placement='server' the servers "
                              "update from the gradients as backward() produced them; use placement='worker' (and "
                              "optimizer.synchronize() before clipping)")
        if self._round_open and so.snapshot(self.optimizer) != self._sent:
            raise ConfigError("param_groups changed between backward() and step(): with placement='server' the "
                              "servers update while backward() runs, with the values of before. Change lr, "
                              "weight_decay, momentum, ... before the forward pass (an LR scheduler stepped after "
                              f"optimizer.step() is fine), or {so.WORKER_HINT}")
        for slot in self.slots.values():
            if slot.pushed or slot.arrived:
                slot.step_pending = True
            slot.in_round = False
        self._pushed_grads.clear()
        self._round_open = False

    def _apply(self, slots: list[_Slot]) -> None:
        """The servers' new values of these parameters become the parameters."""
        with torch.no_grad():
            for slot in slots:
                slot.param.copy_(slot.avg)
                slot.arrived = False

    def synchronize(self) -> None:
        raise ConfigError("optimizer.synchronize() puts averaged gradients into .grad for a whole step on the "
                          "workers; with placement='server' the servers update from the gradients backward() sent, "
                          "so clipping by global norm or GradScaler cannot take part: use placement='worker'")

    # -- optimizer state ------------------------------------------------------------------------------------
    def state_dict(self, inner_state_dict) -> dict:
        """torch's optimizer.state_dict(), with each parameter's state joined from its slices on the servers."""
        self.finish_all()  # every result here: the servers have finished every update this worker pushed
        pieces, counts = self._gather()
        self.optimizer.state.clear()
        for slot in self.slots.values():
            kid = key_id(slot.key)
            slices = self.worker.slices(slot.key)
            parts = [pieces.get((kid, index)) for index, _, _, _ in slices]
            if not slices or all(p is None for p in parts):
                continue  # never updated: torch keeps no state either
            if any(p is None for p in parts):
                raise P3Error(f"the servers hold optimizer states for only some slices of {slot.key[6:]}")
            n = len(parts[0])
            whole = [np.empty(slot.param.numel(), dtype=parts[0][i].dtype) for i in range(n)] if n else []
            for (_, offset, count, _), arrays in zip(slices, parts):
                for i in range(n):
                    whole[i][offset:offset + count] = arrays[i]
            state = so.to_torch(self.spec, counts.get(kid, 0), whole, slot.param)
            if state is not None:
                self.optimizer.state[slot.param] = state
        try:
            return inner_state_dict()
        finally:
            self.optimizer.state.clear()

    def _gather(self) -> tuple[dict, dict]:
        """{(key id, slice): [state arrays]} from every server, and each key's update count."""
        pieces: dict = {}
        counts: dict[int, int] = {}
        page_bytes = self.worker.config.max_message_bytes // 2
        for s in range(self.worker.num_servers):
            start = 0
            while start is not None:
                body = json.dumps({"start": start, "max_bytes": page_bytes}).encode()
                header, arrays = requests.unpack(self._request(s, requests.NATIVE_GET_STATES, body))
                at = 0
                for key, slc, _, n in header["slices"]:
                    pieces[(int(key), int(slc))] = arrays[at:at + n]
                    at += n
                for key, count in header["counts"].items():
                    counts[int(key)] = max(count, counts.get(int(key), 0))
                start = header["next"]
        return pieces, counts

    def load_state_dict(self, inner_load, state_dict: dict) -> None:
        """torch's optimizer.load_state_dict(); the loaded state then continues on the servers."""
        self.finish_all()
        inner_load(state_dict)  # torch checks it and casts each state to its parameter's dtype
        self._send_states()

    def _send_states(self) -> None:
        """The optimizer's state (as load_state_dict left it) to the servers, cut into slices (from worker 0);
        then the workers' optimizer keeps none. The next update of each key continues from it."""
        try:
            spec = so.kernel_spec(self.optimizer)
            if self.worker.rank != 0:
                return
            per_server: list[dict] = [{} for _ in range(self.worker.num_servers)]
            counts: dict[str, int] = {}
            for slot in self.slots.values():
                count, arrays = so.from_torch(spec, self.optimizer.state.get(slot.param, {}), slot.key[6:])
                kid = key_id(slot.key)
                counts[str(kid)] = count
                if not arrays:
                    continue
                for index, offset, n, server in self.worker.slices(slot.key):
                    per_server[server][(kid, index)] = (slot.param.dtype, [a[offset:offset + n] for a in arrays])
            page_bytes = self.worker.config.max_message_bytes // 2
            for s, states in enumerate(per_server):
                for i, page in enumerate(_pages(states, page_bytes)):
                    header = {"slices": [[str(k), idx, tensors.SUPPORTED[dtype], len(a)]
                                         for (k, idx), (dtype, a) in page.items()],
                              "counts": counts if i == 0 else {}, "first": i == 0}
                    body = requests.pack(header, [x for _, a in page.values() for x in a])
                    self._request(s, requests.NATIVE_SET_STATES, body)
        finally:
            self.optimizer.state.clear()
        # The loaded param_groups reach the servers before the next iteration's first push.
        self._sent = None


def _pages(states: dict, max_bytes: int) -> list[dict]:
    """`states` ({(key, slice): (dtype, arrays)}) in pages of at most `max_bytes` (at least one slice each, and
    one page even when empty: the first page of a server replaces its states)."""
    out: list[dict] = [{}]
    size = 0
    for index, (dtype, arrays) in states.items():
        n = 64 + sum(int(a.nbytes) for a in arrays)
        if out[-1] and size + n > max_bytes:
            out.append({})
            size = 0
        out[-1][index] = (dtype, arrays)
        size += n
    return out
