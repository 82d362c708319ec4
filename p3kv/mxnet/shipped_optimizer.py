"""The workers' MXNet optimizer as the servers get it (the paper's server-side update): a copy that keeps Gluon's
per-parameter multipliers, and the hyperparameters whose change during training is carried to the servers."""

from __future__ import annotations

import pickle


def server_copy(optimizer):
    """The optimizer as servers need it: MXNet drops `param_dict` when pickling (so dist_sync loses Gluon's
    per-parameter lr_mult/wd_mult on servers); fold them into the index-keyed multipliers first."""
    opt = pickle.loads(pickle.dumps(optimizer))
    opt.lr_mult, opt.wd_mult = multipliers(optimizer)
    return opt


def multipliers(optimizer) -> tuple[dict, dict]:
    """lr_mult and wd_mult by index, with Gluon's per-parameter ones (param_dict) folded in."""
    lr_mult, wd_mult = dict(optimizer.lr_mult), dict(optimizer.wd_mult)
    for index, param in getattr(optimizer, "param_dict", {}).items():
        lr_mult[index] = param.lr_mult
        wd_mult[index] = param.wd_mult
    return lr_mult, wd_mult


# Optimizer attributes that are state, not hyperparameters: the servers keep their own (update counts), or
# they describe the model (names), or they drive themselves on the servers (the lr scheduler runs there on
# the servers' update counts; changing a scheduler object on the workers is not carried).
_NOT_HYPERPARAMETERS = {"num_update", "_index_update_count", "_all_index_update_counts", "idx2name", "sym_info",
                        "param_dict", "lr_scheduler", "lr_mult", "wd_mult"}
_SCALARS = (bool, int, float, str, type(None))


def hyperparameters(optimizer) -> dict:
    """The optimizer's hyperparameters as servers need them (see p3kv.core.requests.SET_HYPERPARAMETERS): every scalar
    attribute (lr, wd, rescale_grad, momentum, clip_gradient, beta1, ...) and the folded multipliers."""
    hyper = {name: value for name, value in vars(optimizer).items()
             if name not in _NOT_HYPERPARAMETERS and (isinstance(value, _SCALARS) or (
                 isinstance(value, tuple) and all(isinstance(v, _SCALARS) for v in value)))}
    hyper["lr_mult"], hyper["wd_mult"] = multipliers(optimizer)
    return hyper
