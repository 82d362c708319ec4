"""`distribute(model, optimizer)`: the one call that makes a torch training loop a p3kv worker."""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import types

import torch

from p3kv.core.errors import ConfigError
from p3kv.core.worker import P3Worker
from p3kv.launch.torchrun import started_by_torchrun
from p3kv.torch import cuda_staging, server_optimizer, torchrun
from p3kv.torch.server_placement import ServerSynchronizer
from p3kv.torch.synchronizer import Synchronizer

log = logging.getLogger("p3kv.torch")

PLACEMENTS = ("worker", "server")
_worker: P3Worker | None = None


def worker() -> P3Worker:
    """This process's P3Worker (joined at the first call; the job comes from the P3_* environment that
    `python -m p3kv.launch` sets). Its rank is the worker's rank, equal to the RANK the launcher exports."""
    if _worker is None:
        if started_by_torchrun():
            raise ConfigError("this script was started by torchrun, not by python -m p3kv.launch: nothing started "
                              "p3kv's scheduler and servers. Pass servers=S to p3kv.torch.distribute (or call "
                              "p3kv.torch.init_from_torchrun(servers=S) first): local rank 0 of each node then "
                              "starts them")
        adopt(P3Worker())
    assert _worker is not None
    return _worker


def joined() -> bool:
    return _worker is not None


def adopt(w: P3Worker) -> None:
    """`w` becomes this process's worker (p3kv.torch.torchrun joins through this); it closes at exit."""
    global _worker
    _worker = w
    atexit.register(_close_at_exit, w)


def _close_at_exit(w: P3Worker) -> None:
    """A script that ends normally leaves the job cleanly; one that dies of an exception (sys.last_value is set
    for an unhandled one) must not: a clean close would tell the others it merely ran fewer steps. Its
    connections drop instead, and the job fails naming this worker."""
    if getattr(sys, "last_value", None) is not None:
        w.__exit__(type(sys.last_value), sys.last_value, None)
        return
    w.close()


def distribute(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, placement: str = "worker",
               unused_parameters: str = "error", backward_passes_per_step: int = 1,
               broadcast_buffers: bool = True, servers: int | None = None
               ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Makes `model` and `optimizer` train data-parallel over p3kv; returns them (the same objects, hooked).

    The training loop stays as it is (forward, loss.backward(), optimizer.step(), optimizer.zero_grad()); the
    result equals torch's DistributedDataParallel with the same optimizer, seed and data shards (bitwise for two
    workers in float32 without BatchNorm):

    - At this call every worker joins the job and takes worker 0's parameters and buffers (as DDP's broadcast at
      construction).
    - Worker placement (the default): servers only sum. Each parameter's gradient leaves as soon as it is
      final (its post-accumulate-grad hook), multiplied by 1/world size as DDP does, as one key sliced by the core
      and pushed with its forward-order priority (the first forward pass learns the order of the modules; the
      first layer is the most urgent). `optimizer.step()` returns at once: each parameter's update is the user's
      own optimizer run on that parameter alone with the hyperparameters step() saw (LR schedulers may change them
      right after step()), applied when its average has arrived and the module that reads it starts its next
      forward pass (one optimizer call for the module's parameters). The next forward therefore overlaps the
      communication of the later layers. This needs an optimizer whose update of one parameter depends on that
      parameter only (every torch.optim optimizer but LBFGS); otherwise call `optimizer.synchronize()` before
      `optimizer.step()` (below).
    - `optimizer.synchronize()` waits for every average and writes it into each parameter's .grad; the next
      step() then updates all parameters at once. Call it before clipping by global norm, GradScaler's unscale_
      or anything that reads averaged gradients (as with Horovod). Without it, .grad holds this worker's local
      gradient after backward.
    - Parameters are current when the modules reading them run forward, after `optimizer.synchronize()`, and
      after `model.state_dict()` / `optimizer.state_dict()` (both finish pending updates first). Read them
      directly (e.g. `model.parameters()` at the end) only after one of these.
    - Gradient accumulation: backward passes inside `with model.no_sync():` only accumulate locally (as DDP);
      or `backward_passes_per_step=N` pushes after every N-th backward pass (as Horovod).
    - Unused parameters: a trained parameter that got no gradient since the last step() is an error naming it
      (`unused_parameters='error'`, like DDP's find_unused_parameters=False), or zeros are pushed for it
      (`unused_parameters='zeros'`). Parameters with requires_grad=False are never sent.
    - Buffers: with broadcast_buffers (default, as DDP) worker 0's floating-point buffers (BatchNorm's running
      statistics) reach every worker after each synchronized forward pass, before the modules owning them run
      again.
    - Tensors: dense contiguous float32, float16, bfloat16 or float64 parameters (the servers sum float16 and
      bfloat16 in float32), all on the CPU or all on one CUDA device (p3kv.torch.cuda_staging: through pinned host
      buffers on a side stream; the forward waits on an event). Parameters on several devices are refused.
    - servers=S: under torchrun (no p3kv launcher) local rank 0 of each node starts p3kv's scheduler and servers
      (p3kv.torch.torchrun); under python -m p3kv.launch, S must equal its -s.
    - Refused: step(closure) (LBFGS re-runs forward and backward inside step()).

    placement='server' (the paper's placement; docs/torch.md) runs the optimizer on the servers instead, per slice,
    with native kernels following torch's formulas: torch.optim.SGD, Adam and AdamW only, with the same settings
    in every param group but lr and weight_decay. Workers push gradients and get back parameters; the servers
    hold the weights from this call on (load a model's state before it). step() returns at once and the new values
    become the parameters as in worker placement. param_groups changes (LR schedulers) reach the servers before
    the next iteration's first push; optimizer.state_dict()/load_state_dict() gather the state from the servers
    and send it back, in torch's format. Refused with a ConfigError naming placement='worker': other optimizers,
    differentiable/capturable, optimizer.synchronize(), gradients changed between backward() and step()
    (clip_grad_norm_), GradScaler.step, param_groups changed between backward() and step(), bfloat16
    parameters.
    """
    if placement not in PLACEMENTS:
        raise ConfigError(f"placement={placement!r}: p3kv.torch has placement='worker' (servers sum, each worker "
                          "runs the optimizer) and placement='server' (the optimizer runs on the servers)")
    if getattr(optimizer, "_p3kv_sync", None) is not None:
        raise ConfigError("this optimizer is already distributed by p3kv.torch.distribute")
    # Refused before joining the job (and before torchrun's services start): every worker raises the same at once.
    cuda_staging.model_device(model)
    if placement == "server":
        spec = server_optimizer.kernel_spec(optimizer)
        server_optimizer.check_dtypes(spec, [(n, p) for n, p in model.named_parameters() if p.requires_grad])
    torchrun.join(servers)
    options = dict(unused_parameters=unused_parameters, backward_passes_per_step=backward_passes_per_step,
                   broadcast_buffers=broadcast_buffers)
    if placement == "server":
        sync = ServerSynchronizer(model, optimizer, worker(), spec, **options)
    else:
        sync = Synchronizer(model, optimizer, worker(), **options)
    _patch_optimizer(optimizer, sync)
    model.no_sync = types.MethodType(_no_sync_of(sync), model)
    log.info("worker %d of %d: %d parameters, %d servers, placement=%s", sync.worker.rank, sync.worker.num_workers,
             len(sync.slots), sync.worker.num_servers, placement)
    return model, optimizer


def _no_sync_of(sync: Synchronizer):
    @contextlib.contextmanager
    def no_sync(model):
        """Backward passes inside only accumulate gradients locally (DDP's no_sync)."""
        previous, sync.no_sync = sync.no_sync, True
        try:
            yield
        finally:
            sync.no_sync = previous
    return no_sync


def _patch_optimizer(optimizer: torch.optim.Optimizer, sync: Synchronizer) -> None:
    """The optimizer stays the user's object (LR schedulers, isinstance checks); step/state_dict are wrapped on
    the instance. Per-parameter updates call the original step."""
    inner_step = sync.inner_step
    inner_state_dict = optimizer.state_dict
    inner_load = optimizer.load_state_dict

    def step(self, closure=None):
        if closure is not None:
            raise ConfigError("p3kv.torch cannot run step(closure): a closure (LBFGS) re-runs forward and backward "
                              "inside step(), which the other workers would not match; use an optimizer without "
                              "a closure")
        self._opt_called = True  # what an LR scheduler's own wrapper of step() records
        if sync.synchronized:
            sync.stepped()
            return inner_step()
        sync.request_step()
        return None

    def synchronize(self):
        sync.synchronize()

    def state_dict(self):
        if isinstance(sync, ServerSynchronizer):
            return sync.state_dict(inner_state_dict)
        sync.finish_all()
        return inner_state_dict()

    def load_state_dict(self, state_dict):
        if isinstance(sync, ServerSynchronizer):
            return sync.load_state_dict(inner_load, state_dict)
        sync.finish_all()
        return inner_load(state_dict)

    if isinstance(sync, ServerSynchronizer):
        # GradScaler.step then hands the scale and inf flag to step() (as to a fused optimizer) instead of unscaling
        # .grad in place (which bumps no version counter): step() sees them and refuses GradScaler by name.
        optimizer._step_supports_amp_scaling = True
    # An LR scheduler made before distribute() wrapped step() and checks that it still is: ours counts as its.
    step._wrapped_by_lr_sched = True
    optimizer._p3kv_sync = sync
    optimizer.step = types.MethodType(step, optimizer)
    optimizer.synchronize = types.MethodType(synchronize, optimizer)
    optimizer.state_dict = types.MethodType(state_dict, optimizer)
    optimizer.load_state_dict = types.MethodType(load_state_dict, optimizer)
