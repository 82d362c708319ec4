"""Worker mode's engine: one p3kv key per parameter, pushed from the parameter's post-accumulate-grad hook with its
forward-order priority, waited for (and the user's optimizer applied to that parameter alone, one call for the
module's parameters) in the forward pre-hook of the module about to read it. Servers only sum; the average is
DDP's (each gradient multiplied by 1/world size before the sum, as DDP's reducer does), so two workers give DDP's
bits.

Threads: hooks run on the thread that calls backward()/forward() (autograd's CPU thread is the caller's; for CUDA
tensors autograd's device thread runs them while the caller waits in backward()); the core is thread-safe. State
here is touched only from those calls and from DistributedOptimizer's methods.

CUDA models: each key's tensors travel through pinned host buffers (p3kv.torch.cuda_staging, `self.staging`);
slot.send/slot.avg are then device tensors and the staging pushes and waits. CPU models (staging None) share the
tensors' own memory with the core, as before.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

from p3kv.core.errors import ConfigError, P3Error
from p3kv.core.worker import P3Worker
from p3kv.torch import cuda_staging, tensors
from p3kv.torch.buffers import BufferBroadcast
from p3kv.torch.forward_order import ForwardOrder

log = logging.getLogger("p3kv.torch")

UNUSED_CHOICES = ("error", "zeros")


@dataclasses.dataclass(eq=False)
class _Slot:
    """One parameter's key and its state in the current step."""

    key: str  # the parameter's name in the model, prefixed "param:"
    param: torch.nn.Parameter
    send: torch.Tensor  # gradient / world size, read by the core until the push completes
    send_np: np.ndarray
    avg: torch.Tensor  # the servers' sum (the averaged gradient), written by the core as slices land
    avg_np: np.ndarray
    group: int  # index of the optimizer param_group holding the parameter
    passes: int = 0  # backward passes since the last push (backward_passes_per_step)
    pushed: bool = False  # a push is outstanding (not waited for yet)
    arrived: bool = False  # `avg` holds an average no step has consumed yet
    step_pending: bool = False  # step() was called: apply the optimizer when `avg` is here
    in_round: bool = False  # pushed since the last step()
    staged: cuda_staging.StagedKey | None = None  # CUDA: the key's pinned buffers and events


class Synchronizer:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, worker: P3Worker, *,
                 unused_parameters: str = "error", backward_passes_per_step: int = 1,
                 broadcast_buffers: bool = True):
        if unused_parameters not in UNUSED_CHOICES:
            raise ConfigError(f"unused_parameters={unused_parameters!r}: use 'error' (like DDP's default) or "
                              "'zeros' (push zeros for a parameter without a gradient, like "
                              "find_unused_parameters=True)")
        if backward_passes_per_step < 1:
            raise ConfigError(f"backward_passes_per_step={backward_passes_per_step}: must be >= 1")
        self.model, self.optimizer, self.worker = model, optimizer, worker
        self.inner_step = optimizer.step  # before p3kv.torch.distributed wraps it
        self.unused_parameters = unused_parameters
        self.backward_passes_per_step = backward_passes_per_step
        self.scale = 1.0 / worker.num_workers  # DDP's reducer multiplies by this before the sum
        self.no_sync = False
        self.synchronized = False  # synchronize() put the averages into .grad: the next step() is immediate
        self._snapshot: list[dict] = []  # the param_groups' hyperparameters when step() was called
        self._handles: list = []
        self.staging = cuda_staging.select(cuda_staging.model_device(model), worker, worker.config.timeout)
        group_of = {p: i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}
        self.slots: dict[torch.nn.Parameter, _Slot] = {}
        owners: dict[str, list] = {}
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue  # frozen: never pushed, as DDP
            if p not in group_of:
                raise ConfigError(f"parameter {name!r} requires grad but is not in the optimizer's param_groups; "
                                  "give the optimizer every trained parameter (or set requires_grad=False)")
            tensors.check(f"parameter {name!r}", p)
            staged = None if self.staging is None else self.staging.register(f"param:{name}", p)
            if staged is None:
                send, send_np = tensors.buffer_like(p)
                avg, avg_np = tensors.buffer_like(p)
            else:
                send, send_np, avg, avg_np = staged.send_dev, staged.send_np, staged.recv_dev, staged.recv_np
            self.slots[p] = _Slot(f"param:{name}", p, send, send_np, avg, avg_np, group_of[p], staged=staged)
            owners[f"param:{name}"] = []
        self._owned: dict[int, list[_Slot]] = {}  # id(module) -> its direct parameters' slots
        by_id = {id(p): s for p, s in self.slots.items()}
        for module in model.modules():
            for _, p in module.named_parameters(recurse=False):
                slot = by_id.get(id(p))
                if slot is not None:
                    self._owned.setdefault(id(module), []).append(slot)
                    owners[slot.key].append(module)
        self.buffers = BufferBroadcast(model, worker, self.staging) if broadcast_buffers else None
        if self.buffers is not None:
            for key, module in self.buffers.owners().items():
                owners[key] = [module]
        self.order = ForwardOrder(owners)
        self._init_keys()
        self._install_hooks()

    # -- set-up ---------------------------------------------------------------------------------------------
    def _init_keys(self) -> None:
        """Every worker starts from worker 0's parameters (and buffers), as DDP broadcasts them at construction."""
        for slot in self.slots.values():
            if slot.staged is not None:
                self.staging.init(slot.staged, slot.param.data, tensors.wire_dtype(slot.param))
                continue
            value = tensors.view(slot.param.data)
            self.worker.init(slot.key, value, out=value, wire_dtype=tensors.wire_dtype(slot.param))
        if self.buffers is not None:
            self.buffers.init()
        self.worker.wait()
        if self.staging is not None:
            self.staging.finish_init()

    def _install_hooks(self) -> None:
        root = self.model
        self._handles.append(root.register_forward_pre_hook(self._root_starts))
        self._handles.append(root.register_forward_hook(self._root_ends))
        for module in root.modules():
            if id(module) in self._owned or (self.buffers is not None and self.buffers.has(module)):
                self._handles.append(module.register_forward_pre_hook(self._module_starts))
        for p in self.slots:
            self._handles.append(p.register_post_accumulate_grad_hook(self._gradient_ready))
        self._handles.append(root.register_state_dict_pre_hook(lambda *a, **k: self.finish_all()))

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # -- forward --------------------------------------------------------------------------------------------
    def _root_starts(self, module, args) -> None:
        self.order.start_pass()
        if self.order.learned:
            # Parameters read without their module's forward running (e.g. F.linear(x, self.child.weight)):
            # the root waits for them.
            for mid, slots in self._owned.items():
                if mid not in self.order.ran:
                    self._finish(slots)
            if self.buffers is not None:
                self.buffers.finish_unowned(self.order.ran)

    def _module_starts(self, module, args) -> None:
        self.order.module_starts(module)
        slots = self._owned.get(id(module))
        if slots:
            self._finish(slots)
        if self.buffers is not None:
            self.buffers.finish(module)

    def _root_ends(self, module, args, output) -> None:
        self.order.end_pass()
        # As DDP: buffers go from worker 0 to all after a forward that will be synchronized; the next forward
        # waits for them (each module for its own).
        if self.buffers is not None and torch.is_grad_enabled() and not self.no_sync:
            self.buffers.push(self.order)

    # -- backward -------------------------------------------------------------------------------------------
    def _gradient_ready(self, p: torch.nn.Parameter) -> None:
        if self.no_sync:
            return
        slot = self.slots[p]
        slot.passes += 1
        if slot.passes < self.backward_passes_per_step:
            return
        slot.passes = 0
        self._push(slot, p.grad)

    def _push(self, slot: _Slot, grad: torch.Tensor | None) -> None:
        if slot.pushed:  # a second backward before step(): the earlier average is superseded
            self._wait_key(slot)
            slot.pushed = False
        if slot.step_pending:
            raise P3Error(f"{slot.key[6:]} got a new gradient before the forward pass applied its previous "
                          "step(); p3kv.torch applies a step when the module reading the parameter starts its "
                          "forward: run forward between step() and backward()")
        if slot.staged is not None:
            self.staging.push(slot.staged, grad, self.scale, self.order.of(slot.key))
        else:
            with torch.no_grad():
                if grad is None:
                    slot.send.zero_()
                else:
                    torch.mul(grad, self.scale, out=slot.send)
            self.worker.push(slot.key, slot.send_np, out=slot.avg_np, priority=self.order.of(slot.key))
        slot.pushed, slot.arrived, slot.in_round = True, False, True

    # -- step -----------------------------------------------------------------------------------------------
    def request_step(self) -> None:
        """step(): the update of each parameter is applied when its average has arrived and a module is about to
        read it (or at finish_all())."""
        self.check_round()
        self._snapshot = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        for slot in self.slots.values():
            if slot.pushed or slot.arrived:
                slot.step_pending = True
            slot.in_round = False

    def check_round(self) -> None:
        """After the backward pass(es) of a step: every parameter pushed (or zeros pushed for it), or an error."""
        missing = [s for s in self.slots.values() if not s.in_round]
        if missing and len(missing) < len(self.slots):
            self._unused(missing)

    def _unused(self, missing: list[_Slot]) -> None:
        names = ", ".join(s.key[6:] for s in missing[:5]) + (" ..." if len(missing) > 5 else "")
        if self.unused_parameters == "error":
            raise P3Error(f"{len(missing)} parameter(s) got no gradient since the last step(): {names}. The other "
                          "workers would wait for them. If the model does not use every parameter in each "
                          "iteration, pass unused_parameters='zeros' to p3kv.torch.distribute (as DDP's "
                          "find_unused_parameters=True), or set requires_grad=False on parameters never trained")
        log.debug("pushing zeros for unused parameters: %s", names)
        for slot in missing:
            self._push(slot, None)

    def _finish(self, slots: list[_Slot]) -> None:
        """Waits for the slots' averages and applies their pending steps (all in one optimizer step: a module's
        weight and bias, or every parameter at finish_all, cost one call of the optimizer, not one each)."""
        ready = []
        for slot in slots:
            if slot.pushed:
                self._wait_key(slot)
                slot.pushed, slot.arrived = False, True
            if slot.step_pending and slot.arrived:
                ready.append(slot)
            slot.step_pending = False
        if ready:
            self._apply(ready)

    def _wait_key(self, slot: _Slot) -> None:
        """Until the slot's push completed: its result is in slot.avg (CUDA: for the current stream)."""
        if slot.staged is not None:
            self.staging.wait(slot.staged)
        else:
            self.worker.wait(slot.key)

    def _apply(self, slots: list[_Slot]) -> None:
        """The user's optimizer on these parameters only, with the hyperparameters step() saw (each in its own
        param_group's). One step() call: torch's optimizers update each parameter on its own (the single-tensor
        path on the CPU; foreach/fused kernels are element-wise), so which parameters share a call changes no bit."""
        opt = self.optimizer
        members: dict[int, list[torch.nn.Parameter]] = {}
        for slot in slots:
            members.setdefault(slot.group, []).append(slot.param)
        groups = []
        for index, params in members.items():
            group = dict(self._snapshot[index])
            group["params"] = params
            groups.append(group)
        saved_groups, saved_grads = opt.param_groups, [slot.param.grad for slot in slots]
        opt.param_groups = groups
        for slot in slots:
            slot.param.grad = slot.avg
        try:
            self.inner_step()
        finally:
            opt.param_groups = saved_groups
            for slot, grad in zip(slots, saved_grads):
                slot.param.grad = grad
        for slot in slots:
            slot.arrived = False

    def finish_all(self) -> None:
        """Waits for every outstanding push and applies every pending step (parameters are current after it)."""
        self._finish(list(self.slots.values()))
        if self.buffers is not None:
            self.buffers.finish_all()

    def synchronize(self) -> None:
        """Horovod's synchronize(): before step(), waits for every average and writes it into .grad, so that the
        next step() updates every parameter at once (after clipping by global norm, GradScaler's unscale_...)."""
        self.check_round()
        self.finish_all()
        for slot in self.slots.values():
            if slot.arrived:
                if slot.param.grad is None:
                    slot.param.grad = slot.avg.clone()
                else:
                    slot.param.grad.copy_(slot.avg)
                slot.arrived = False
                self.synchronized = True
            slot.in_round = False

    def stepped(self) -> None:
        """step() after synchronize(): the whole optimizer ran on the averages."""
        self.synchronized = False
