"""The Python half of the server's native optimizer kernels (cpp/include/p3/optimizer.h).

What MXNet computes once per parameter and update (the update count, the learning rate after the scheduler
and lr_mult, weight decay after wd_mult, bias corrections) is computed here, once per key and iteration;
the per-element work runs in C++ on each slice without the GIL. Everything here follows MXNet 1.9.1's
`Optimizer.update_multi_precision(index, weight, grad, state)` with a single index, which is what MXNet's own
dist_sync server runs.

Public API: kernel_spec, step_params, state_template, flatten_state, unflatten_state.
mxnet is imported only by the functions that need it.
"""

from __future__ import annotations

import math

import numpy as np

# MXNet class name -> kernel kind. Matched on the exact class: a subclass may override update().
_KINDS = {
    "SGD": "sgd", "NAG": "nag", "Adam": "adam", "RMSProp": "rmsprop", "AdaGrad": "adagrad",
    "AdaDelta": "adadelta", "Adamax": "adamax", "Signum": "signum", "Ftrl": "ftrl", "FTML": "ftml",
}
# Kinds whose dense update is NDArray arithmetic in Python: they clip whenever clip_gradient is not None.
# MXNet optimizers that run as native kernels on the servers (for messages).
KERNEL_OPTIMIZERS = tuple(_KINDS)
_PYTHON_CLIP = {"adagrad", "adadelta", "adamax"}

_LAYERWISE = ("LARS", "LAMB", "LBSGD")


def _mx_optimizers():
    from mxnet import optimizer
    return optimizer


def _refuse(opt) -> None:
    mxo = _mx_optimizers()
    for name in _LAYERWISE:
        if isinstance(opt, getattr(mxo, name)):
            raise ValueError(
                f"{type(opt).__name__} scales each layer's update by norms of the whole weight and gradient, "
                "which a server holding one slice cannot compute; run it on the workers with "
                "update_on_kvstore=False")
    if isinstance(opt, mxo.Nadam):
        raise ValueError(
            "Nadam keeps one momentum schedule (m_schedule) on the optimizer object, shared by all parameters "
            "and advanced on every update call, so its result depends on the order and number of update "
            "calls; updating slices separately gives different weights from MXNet's. Run it on the workers "
            "with update_on_kvstore=False")


def kernel_spec(optimizer) -> dict | None:
    """The spec dict (p3::OptimizerSpec by field name) of a native kernel for `optimizer`, or None when the
    server must call MXNet's own update on each slice (a subclass, or settings the kernel does not cover).

    Raises ValueError (naming update_on_kvstore=False) for optimizers that cannot be updated per slice.
    Thread-safety: reads the optimizer only.
    """
    _refuse(optimizer)
    cls = type(optimizer)
    kind = _KINDS.get(cls.__name__)
    if kind is None or cls is not getattr(_mx_optimizers(), cls.__name__):
        return None
    o = optimizer
    spec = {"kind": kind, "multi_precision": bool(o.multi_precision)}
    if kind in ("sgd", "nag", "signum"):
        if o.momentum < 0:
            return None  # MXNet creates a momentum state for it but never uses it
        spec["momentum"] = float(o.momentum)
        if kind == "signum":
            if o.wd_lh and not o.momentum > 0:
                # MXNet 1.9.1 passes wd_lh to signsgd_update, which has no such argument: its first update
                # raises. Refused here, on every worker, instead of updating without wd_lh.
                raise ValueError(f"Signum with momentum {o.momentum} runs MXNet's signsgd_update, which takes no "
                                 f"wd_lh (MXNet raises at the first update): set wd_lh=0 (got {o.wd_lh}) or a "
                                 "momentum > 0")
            spec["wd_lh"] = float(o.wd_lh or 0.0)
    elif kind in ("adam", "ftml"):
        spec.update(beta1=float(o.beta1), beta2=float(o.beta2), epsilon=float(o.epsilon))
    elif kind == "adamax":
        spec.update(beta1=float(o.beta1), beta2=float(o.beta2))
    elif kind == "rmsprop":
        spec.update(gamma1=float(o.gamma1), gamma2=float(o.gamma2), epsilon=float(o.epsilon),
                    centered=bool(o.centered),
                    clip_weights=float(o.clip_weights) if o.clip_weights else -1.0)
    elif kind == "adagrad":
        spec["epsilon"] = float(o.float_stable_eps)
    elif kind == "adadelta":
        spec.update(rho=float(o.rho), epsilon=float(o.epsilon))
    elif kind == "ftrl":
        spec.update(lamda1=float(o.lamda1), beta=float(o.beta))
    if kind in _PYTHON_CLIP and o.clip_gradient is not None and o.clip_gradient < 0:
        return None  # MXNet would clip to an empty range; leave that to MXNet itself
    return spec


def step_params(optimizer, index) -> tuple:
    """(lr, wd, rescale_grad, clip_gradient, t) for the next update of `index`, advancing the optimizer's
    update counts exactly as its update() does. Call it once per key and update, before the kernels run on
    that key's slices. clip_gradient < 0 means no clipping. If it raises (a failing lr_scheduler), nothing
    is counted.

    Thread-safety: mutates the optimizer; call from one thread.
    """
    o = optimizer
    kind = _KINDS.get(type(o).__name__)
    if kind is None:
        raise ValueError(f"no kernel for {type(o).__name__}")
    counts, num_update = o._index_update_count, o.num_update
    counted, before = index in counts, counts.get(index)
    try:
        return _step(o, kind, index)
    except BaseException:
        # Nothing counted: a step that failed (a raising lr_scheduler) is no update, and asking again for the
        # same key and iteration must not count it twice.
        if counted:
            counts[index] = before
        else:
            counts.pop(index, None)
        o.num_update = num_update
        raise


def _step(o, kind: str, index) -> tuple:
    if kind == "adadelta":
        wd = o._get_wd(index)  # AdaDelta reads wd before counting (it has no learning rate)
        o._update_count(index)
        lr = 0.0
    else:
        o._update_count(index)
        lr = o._get_lr(index)
        wd = o._get_wd(index)
    t = o._index_update_count[index]
    if kind == "adam":
        lr *= math.sqrt(1. - o.beta2 ** t) / (1. - o.beta1 ** t)
    elif kind == "adamax":
        lr /= (1. - o.beta1 ** t)
    if kind in _PYTHON_CLIP:
        if o.clip_gradient is not None and o.clip_gradient < 0:
            raise ValueError(f"{type(o).__name__} with a negative clip_gradient has no kernel")
        clip = -1.0 if o.clip_gradient is None else float(o.clip_gradient)
    else:
        clip = float(o.clip_gradient) if o.clip_gradient else -1.0
    return (float(lr), float(wd), float(o.rescale_grad), clip, float(t))


def state_template(optimizer, dtype, index=0):
    """MXNet's state structure for one parameter (create_state_multi_precision on a 1-element array)."""
    import warnings

    import mxnet as mx
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the float16-without-multi_precision advice
        return optimizer.create_state_multi_precision(index, mx.nd.zeros((1,), dtype=dtype))


def flatten_state(state) -> list[np.ndarray]:
    """MXNet's nested state (NDArray / None / tuples and lists of them) as the kernels' flat list: depth first,
    None skipped. NDArrays become numpy arrays (copies); numpy arrays pass through."""
    out: list[np.ndarray] = []

    def walk(s):
        if s is None:
            return
        if isinstance(s, (tuple, list)):
            for item in s:
                walk(item)
        elif isinstance(s, np.ndarray):
            out.append(s)
        else:
            out.append(s.asnumpy())

    walk(state)
    return out


def unflatten_state(template, arrays):
    """The inverse of flatten_state: `template`'s nesting (from state_template) with its NDArrays replaced, in
    order, by NDArrays holding `arrays`. Raises ValueError if the counts differ."""
    import mxnet as mx
    it = iter(arrays)
    used = 0

    def build(s):
        nonlocal used
        if s is None:
            return None
        if isinstance(s, (tuple, list)):
            return type(s)(build(item) for item in s)
        try:
            a = next(it)
        except StopIteration:
            raise ValueError(f"unflatten_state: the template holds more arrays than the {used} given") from None
        used += 1
        a = np.asarray(a)
        return mx.nd.array(a, dtype=a.dtype)

    result = build(template)
    rest = sum(1 for _ in it)
    if rest:
        raise ValueError(f"unflatten_state: {used + rest} arrays given, the template holds {used}")
    return result
