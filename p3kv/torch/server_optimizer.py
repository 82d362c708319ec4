"""A torch optimizer as the servers' native kernel (placement='server'): the kernel and settings it maps to, each
param group's learning rate and weight decay, what the servers cannot run (refused, naming placement='worker'),
and its per-parameter state in torch's format cut into slices' arrays and joined back.

The servers run cpp/src/optimizer.cc's "torch_sgd" and "torch_adam" kernels, which follow torch 2.13's single-tensor
formulas (torch.optim.SGD and Adam/AdamW with foreach=False): torch.optim.SGD, Adam and AdamW, exactly those
classes (a subclass may override step()). One kernel runs per job, so its settings (momentum, dampening, nesterov,
betas, eps, amsgrad, maximize, decoupled weight decay) must be the same in every param group; lr and weight_decay
are per parameter (per key), as torch takes them from each parameter's group. foreach and fused select another
implementation of the same formulas and are ignored.
"""

from __future__ import annotations

import numpy as np
import torch

from p3kv import _p3
from p3kv.core.errors import ConfigError
from p3kv.torch import tensors

WORKER_HINT = "use placement='worker' (the servers sum, and every worker runs your optimizer)"

# The param-group entries the servers use: a change of any of them reaches the servers before the next update.
_KERNEL_FIELDS = ("momentum", "dampening", "nesterov", "maximize", "betas", "eps", "amsgrad",
                  "decoupled_weight_decay", "differentiable", "capturable")
_FIELDS = ("lr", "weight_decay", *_KERNEL_FIELDS)


def _number(v) -> float:
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


def kernel_spec(optimizer: torch.optim.Optimizer) -> dict:
    """The servers' kernel spec for `optimizer` (p3::OptimizerSpec fields by name). Raises ConfigError, naming
    placement='worker', for what the servers cannot run per slice."""
    cls = type(optimizer)
    if cls is torch.optim.SGD:
        kind = "torch_sgd"
    elif cls is torch.optim.Adam or cls is torch.optim.AdamW:
        kind = "torch_adam"
    else:
        raise ConfigError(f"placement='server' runs torch.optim.SGD, Adam and AdamW on the servers (native kernels "
                          f"with torch's formulas, applied per slice); {cls.__module__}.{cls.__name__} has no server "
                          f"kernel: {WORKER_HINT}")
    specs = [_group_spec(kind, g, i) for i, g in enumerate(optimizer.param_groups)]
    for i, spec in enumerate(specs[1:], 1):
        differ = sorted(k for k in spec if spec[k] != specs[0][k])
        if differ:
            raise ConfigError(f"param_groups 0 and {i} differ in {', '.join(differ)}: the servers run one kernel per "
                              "job and take only lr and weight_decay per param group; give every group the same "
                              f"settings, or {WORKER_HINT}")
    return specs[0]


def _group_spec(kind: str, g: dict, index: int) -> dict:
    for flag, why in (("differentiable", "the update is part of an autograd graph on the workers"),
                      ("capturable", "the update runs in a CUDA graph on the workers")):
        if g.get(flag):
            raise ConfigError(f"param_group {index} has {flag}=True ({why}): the servers cannot run that; "
                              f"{WORKER_HINT}")
    if kind == "torch_sgd":
        return {"kind": kind, "momentum": _number(g["momentum"]), "dampening": _number(g["dampening"]),
                "nesterov": bool(g["nesterov"]), "maximize": bool(g["maximize"])}
    beta1, beta2 = g["betas"]
    return {"kind": kind, "beta1": _number(beta1), "beta2": _number(beta2), "epsilon": _number(g["eps"]),
            "amsgrad": bool(g["amsgrad"]), "maximize": bool(g["maximize"]),
            "decoupled_weight_decay": bool(g.get("decoupled_weight_decay", False))}


def group_hyperparameters(g: dict) -> dict:
    """A param group's per-key values on the servers."""
    return {"lr": _number(g["lr"]), "wd": _number(g["weight_decay"])}


def snapshot(optimizer: torch.optim.Optimizer) -> list[tuple]:
    """What the servers' updates depend on in the param groups, comparable between two calls (cheap: read once per
    iteration)."""
    return [tuple((k, _snap(g[k])) for k in _FIELDS if k in g) for g in optimizer.param_groups]


def _snap(v):
    if isinstance(v, torch.Tensor):
        return float(v.item())
    if isinstance(v, (tuple, list)):
        return tuple(_snap(x) for x in v)
    return v


def check_dtypes(spec: dict, named_params: list) -> None:
    """ConfigError naming a parameter whose dtype the kernel does not update."""
    checked: dict = {}
    for name, p in named_params:
        dtype = tensors.SUPPORTED.get(p.dtype)
        if dtype not in checked:
            try:
                _p3.num_states(spec, dtype)
                checked[dtype] = None
            except ValueError as e:
                checked[dtype] = str(e)
        if checked[dtype] is not None or dtype == "bfloat16":
            raise ConfigError(f"parameter {name!r} is {p.dtype}: the servers' {spec['kind']} kernel does not update "
                              f"it ({checked[dtype] or 'numpy carries no bfloat16 state'}); {WORKER_HINT}")


def state_names(spec: dict) -> list[str]:
    """torch's state tensors of one parameter, in the order of the kernel's state arrays."""
    if spec["kind"] == "torch_sgd":
        return ["momentum_buffer"] if spec["momentum"] != 0 else []
    return ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if spec["amsgrad"] else [])


def to_torch(spec: dict, count: int, arrays: list[np.ndarray], param: torch.Tensor) -> dict | None:
    """One parameter's state as torch keeps it, from the servers' update count and its whole state arrays (flat,
    joined from the slices); None where torch keeps none (SGD without momentum)."""
    names = state_names(spec)
    if not names:
        return None
    # On the parameter's device, as torch keeps it (a no-op for CPU parameters).
    state = {name: torch.from_numpy(a.copy()).reshape(param.shape).to(param.device) for name, a in zip(names, arrays)}
    if spec["kind"] == "torch_adam":
        # As torch keeps it outside capturable/fused: a float32 scalar tensor on the CPU, first in the dict.
        state = {"step": torch.tensor(float(count), dtype=torch.float32), **state}
    return state


def from_torch(spec: dict, state: dict, name: str) -> tuple[int, list[np.ndarray]]:
    """(update count, flat state arrays) of one parameter from torch's state (as load_state_dict left it: in the
    parameter's dtype). Raises ConfigError when the state does not fit the kernel."""
    names = state_names(spec)
    if not names or not state:
        return 0, []
    missing = [n for n in names if state.get(n) is None]
    if spec["kind"] == "torch_sgd":
        if missing:
            return 0, []  # no momentum buffer yet: torch's next step starts it from the gradient
        # torch's SGD counts no steps; the kernel takes t == 1 as "no buffer yet", so any later count will do.
        count = 1
    else:
        if missing or "step" not in state:
            raise ConfigError(f"the optimizer state of {name!r} has {sorted(state)}; the servers' {spec['kind']} "
                              f"kernel needs step and {', '.join(names)} (a state saved with other settings?)")
        count = int(_number(state["step"]))
    return count, [tensors.view(state[n].detach().cpu().contiguous()).reshape(-1) for n in names]
