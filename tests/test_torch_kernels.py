"""The torch_sgd / torch_adam server kernels (cpp/src/torch_optimizer.cc) against torch.optim.SGD, Adam and AdamW
(foreach=False) on the same data, in process (no network).

Reference: torch's optimizer on one whole float32 parameter of N elements. Kernel: _p3.init_states and
_p3.apply_update on the parameter's slices (cut every 50,000 elements, as the servers slice, and every 37,123: odd
offsets and lengths), with the step tuple a server's step source gives: (lr, weight_decay, 1.0, -1.0, t).
The learning rate changes mid-run, as a scheduler changes param_groups. torch runs with 1 and 2 threads. float64
and float16 weights are tested too (float16 at the end of this module); bfloat16 is refused.

First, torch against itself: its own update gives the same bits on the whole tensor and on the pieces, and on 1
and 2 threads (measured: every config here, torch 2.13.0+cpu, AVX-512 kernels), so the kernel is held to torch's
bits. SGD: bitwise. Adam/AdamW: torch's CPU sqrt is MKL's vector sqrt (VML, high-accuracy mode), which is not
IEEE-rounded (about 17% of float32 results are 1 ulp off), so no kernel that does not call MKL can give its bits.
Hence for the Adam family two comparisons: (a) bitwise against torch's own Adam formulas (a replica of
_single_tensor_adam's tensor operations, checked bit for bit against torch.optim.Adam with torch's sqrt) run with an
IEEE sqrt: this shows the kernel differs from torch in the sqrt only; (b) against torch.optim directly within
ADAM_ATOL (measured largest difference: 4.8e-7 on the weights, 1.2e-7 on the states, after 6 and after 60 steps;
states that do not depend on the weights, i.e. without L2 weight decay, stay bitwise).
"""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not importable: install it (pip install '.[torch]') to test the torch kernels")

from p3kv import _p3  # noqa: E402

pytestmark = pytest.mark.unit

N = 230_017
CUTS = [50_000, 37_123]
THREADS = [1, 2]
# The learning rate of each step: changed mid-run (a scheduler's step between two iterations).
LRS = [0.05, 0.05, 0.05, 0.02, 0.02, 0.01]

# name -> (torch optimizer, its keyword arguments, the kernel's spec dict, weight decay in the step tuple)
CONFIGS = {
    "sgd": ("SGD", {}, {"kind": "torch_sgd"}, 0.0),
    "sgd_wd_max": ("SGD", dict(weight_decay=1e-2, maximize=True),
                   {"kind": "torch_sgd", "maximize": True}, 1e-2),
    "sgd_mom": ("SGD", dict(momentum=0.9), {"kind": "torch_sgd", "momentum": 0.9}, 0.0),
    "sgd_mom_damp_wd": ("SGD", dict(momentum=0.9, dampening=0.1, weight_decay=1e-2),
                        {"kind": "torch_sgd", "momentum": 0.9, "dampening": 0.1}, 1e-2),
    "sgd_mom_damp_max": ("SGD", dict(momentum=0.5, dampening=0.5, maximize=True),
                         {"kind": "torch_sgd", "momentum": 0.5, "dampening": 0.5, "maximize": True}, 0.0),
    "sgd_nesterov": ("SGD", dict(momentum=0.9, nesterov=True),
                     {"kind": "torch_sgd", "momentum": 0.9, "nesterov": True}, 0.0),
    "sgd_nesterov_wd_max": ("SGD", dict(momentum=0.9, nesterov=True, weight_decay=1e-2, maximize=True),
                            {"kind": "torch_sgd", "momentum": 0.9, "nesterov": True, "maximize": True}, 1e-2),
    "adam": ("Adam", {}, {"kind": "torch_adam"}, 0.0),
    "adam_wd": ("Adam", dict(weight_decay=1e-2), {"kind": "torch_adam"}, 1e-2),
    "adam_amsgrad": ("Adam", dict(amsgrad=True), {"kind": "torch_adam", "amsgrad": True}, 0.0),
    "adam_amsgrad_wd_max": ("Adam", dict(amsgrad=True, weight_decay=1e-2, maximize=True),
                            {"kind": "torch_adam", "amsgrad": True, "maximize": True}, 1e-2),
    # 1 - beta1 >= 0.5: torch's lerp takes its other formula.
    "adam_betas_eps": ("Adam", dict(betas=(0.3, 0.99), eps=1e-6),
                       {"kind": "torch_adam", "beta1": 0.3, "beta2": 0.99, "epsilon": 1e-6}, 0.0),
    "adamw": ("AdamW", {}, {"kind": "torch_adam", "decoupled_weight_decay": True}, 1e-2),  # AdamW's wd 1e-2
    "adamw_amsgrad_max": ("AdamW", dict(weight_decay=0.1, amsgrad=True, maximize=True),
                          {"kind": "torch_adam", "decoupled_weight_decay": True, "amsgrad": True,
                           "maximize": True}, 0.1),
    "adam_decoupled_flag": ("Adam", dict(weight_decay=0.1, decoupled_weight_decay=True),
                            {"kind": "torch_adam", "decoupled_weight_decay": True}, 0.1),
}
# Adam's weights and states against torch.optim (whose sqrt is MKL's, not IEEE's): absolute tolerance, for weights
# of order 1 and lr <= 0.05 (measured largest difference 4.8e-7: one float32 ulp of a weight in [2, 4)).
ADAM_ATOL = 1e-6
# torch's state names per parameter, in the order of the kernel's state arrays.
STATE_NAMES = {"SGD": ["momentum_buffer"], "Adam": ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"],
               "AdamW": ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]}


def pieces(size, n=N):
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def data(dtype=np.float32, n=N, seed=27):
    """Initial weights and one gradient per step: magnitudes over five decades, some exact zeros."""
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal(n).astype(dtype)
    grads = []
    for _ in LRS:
        g = rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 1, n)
        g[rng.integers(0, n, n // 100)] = 0.0
        grads.append(g.astype(dtype))
    return weights, grads


def torch_run(config, threads, cut=None, dtype=np.float32, n=N):
    """torch's optimizer on the whole parameter (cut None) or on its pieces as separate parameters: the final
    weights and states (concatenated over the pieces, in STATE_NAMES order) and each piece's final 'step'."""
    cls_name, kwargs, _, _ = CONFIGS[config]
    weights, grads = data(dtype, n)
    ranges = [(0, n)] if cut is None else pieces(cut, n)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        params = [torch.nn.Parameter(torch.from_numpy(weights[a:b].copy())) for a, b in ranges]
        opt = getattr(torch.optim, cls_name)(params, lr=LRS[0], foreach=False, **kwargs)
        for step, lr in enumerate(LRS):
            for group in opt.param_groups:
                group["lr"] = lr
            for p, (a, b) in zip(params, ranges):
                p.grad = torch.from_numpy(grads[step][a:b].copy())
            opt.step()
    finally:
        torch.set_num_threads(previous)
    w = np.concatenate([p.detach().numpy() for p in params])
    names = [s for s in STATE_NAMES[cls_name] if s in opt.state[params[0]]]
    states = [np.concatenate([opt.state[p][s].numpy() for p in params]) for s in names]
    steps = [float(opt.state[p]["step"]) for p in params if "step" in opt.state[p]]
    return w, states, steps


def kernel_run(config, cut, dtype=np.float32, n=N):
    """The kernel per slice, as a server runs it: states from init_states, then per step and slice
    apply_update with (lr, wd, rescale_grad 1.0, no clipping, t = the key's update count)."""
    _, _, spec, wd = CONFIGS[config]
    name = np.dtype(dtype).name
    w, grads = data(dtype, n)
    count = _p3.num_states(spec, name)
    slices = pieces(cut, n)
    states = [[np.full(b - a, np.nan, dtype) for _ in range(count)] for a, b in slices]
    for (a, b), s in zip(slices, states):
        _p3.init_states(spec, name, w[a:b], s)
    for t, lr in enumerate(LRS, start=1):
        for (a, b), s in zip(slices, states):
            _p3.apply_update(spec, (lr, wd, 1.0, -1.0, float(t)), name, w[a:b], grads[t - 1][a:b], s)
    return w, [np.concatenate([s[k] for s in states]) for k in range(count)]


_cache = {}


def torch_whole(config, threads):
    key = (config, threads)
    if key not in _cache:
        _cache[key] = torch_run(config, threads)
    return _cache[key]


def bits(a):
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def half_ulps(got, want):
    """Distance in float16 steps (both finite or both NaN; NaN vs NaN counts 0)."""
    def ordered(a):
        i = a.view(np.uint16).astype(np.int64)
        return np.where(i & 0x8000, -(i & 0x7FFF), i)
    both_nan = np.isnan(got) & np.isnan(want)
    return np.where(both_nan, 0, np.abs(ordered(got) - ordered(want)))


def compare(got, want, what, config, atol=None):
    """Bitwise (NaN-safe), or within `atol`; the message counts the differing elements."""
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype)
    differ = bits(got) != bits(want)
    if atol is not None:
        np.testing.assert_allclose(got, want, rtol=0, atol=atol, err_msg=f"{config} {what}")
        return
    if differ.any():
        i = int(np.flatnonzero(differ)[0])
        err = np.abs(got.astype(np.float64) - want)[differ]
        pytest.fail(f"{config} {what}: {int(differ.sum())} of {got.size} elements differ (first at {i}: "
                    f"{got[i]!r} != {want[i]!r}; largest difference {err.max():.3g})")


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_torch_itself_is_slice_invariant(config, cut, threads):
    # Whether torch's update on the pieces gives the whole tensor's bits, and 1 thread those of 2: the kernel
    # is compared bitwise with torch only where torch agrees with itself.
    w, states, _ = torch_whole(config, threads)
    pw, pstates, _ = torch_run(config, threads, cut)
    compare(pw, w, f"torch's weights on {cut}-element pieces vs the whole tensor", config)
    for k, (got, want) in enumerate(zip(pstates, states)):
        compare(got, want, f"torch's state {k} on pieces vs whole", config)
    other, _, _ = torch_whole(config, 3 - threads)
    compare(other, w, "torch's weights with 1 vs 2 threads", config)


def is_adam(config):
    return CONFIGS[config][2]["kind"] == "torch_adam"


def l2_decay(config):
    _, _, spec, wd = CONFIGS[config]
    return wd != 0 and not spec.get("decoupled_weight_decay", False)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_kernel_per_slice_equals_torch(config, cut, threads):
    w, states, steps = torch_whole(config, threads)
    kw, kstates = kernel_run(config, cut)
    # SGD bitwise; Adam within ADAM_ATOL (torch's sqrt is MKL's: see the module's docstring).
    atol = ADAM_ATOL if is_adam(config) else None
    compare(kw, w, f"weights after {len(LRS)} steps ({cut}-element slices, torch on {threads} threads)", config, atol)
    # The states in torch's state_dict order (what a server hands back for state_dict()); Adam's moments do not
    # depend on the sqrt, so they are bitwise unless L2 decay feeds the weights back into the gradient.
    assert len(kstates) == len(states), (len(kstates), len(states))
    for k, (got, want) in enumerate(zip(kstates, states)):
        name = STATE_NAMES[CONFIGS[config][0]][k]
        compare(got, want, f"state {k} ({name})", config, ADAM_ATOL if l2_decay(config) else None)
    # torch's 'step' is the t the step source passes: the key's update count.
    assert all(s == len(LRS) for s in steps), steps


def ieee_sqrt(t):
    """An IEEE-rounded sqrt (numpy's), in place of torch's MKL one."""
    return torch.from_numpy(np.sqrt(t.numpy()))


def adam_replica(config, sqrt, dtype=np.float32, n=N):
    """torch 2.13's _single_tensor_adam (capturable=False, differentiable=False) written out with the same tensor
    operations in the same order on one whole tensor, with `sqrt` as the square root."""
    _, _, spec, wd = CONFIGS[config]
    beta1, beta2 = spec.get("beta1", 0.9), spec.get("beta2", 0.999)
    eps, amsgrad = spec.get("epsilon", 1e-8), spec.get("amsgrad", False)
    weights, grads = data(dtype, n)
    param = torch.from_numpy(weights.copy())
    exp_avg, exp_avg_sq, max_sq = (torch.zeros_like(param) for _ in range(3))
    step_t = torch.tensor(0.0)
    for i, lr in enumerate(LRS):
        grad = torch.from_numpy(grads[i].copy())
        grad = -grad if spec.get("maximize") else grad
        step_t += 1
        if wd != 0:
            if spec.get("decoupled_weight_decay"):
                param.mul_(1 - lr * wd)
            else:
                grad = grad.add(param, alpha=wd)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = step_t.item()
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        if amsgrad:
            torch.maximum(max_sq, exp_avg_sq, out=max_sq)
            denom = (sqrt(max_sq) / bias_correction2_sqrt).add_(eps)
        else:
            denom = (sqrt(exp_avg_sq) / bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)
    states = [exp_avg, exp_avg_sq] + ([max_sq] if amsgrad else [])
    return param.numpy(), [s.numpy() for s in states]


ADAM_CONFIGS = sorted(c for c in CONFIGS if is_adam(c))


@pytest.mark.parametrize("config", ADAM_CONFIGS)
def test_adam_replica_with_torchs_sqrt_is_torch_optim(config):
    # The replica is faithful: with torch's own sqrt it gives torch.optim's bits.
    w, states, _ = torch_whole(config, 1)
    rw, rstates = adam_replica(config, torch.sqrt)
    compare(rw, w, "replica's weights vs torch.optim", config)
    for k, (got, want) in enumerate(zip(rstates, states)):
        compare(got, want, f"replica's state {k} vs torch.optim", config)


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("config", ADAM_CONFIGS)
def test_adam_kernel_is_torchs_formulas_with_an_ieee_sqrt(config, cut):
    # Bitwise: the kernel differs from torch's Adam in the sqrt alone.
    rw, rstates = adam_replica(config, ieee_sqrt)
    kw, kstates = kernel_run(config, cut)
    compare(kw, rw, f"weights ({cut}-element slices) vs torch's formulas with an IEEE sqrt", config)
    for k, (got, want) in enumerate(zip(kstates, rstates)):
        compare(got, want, f"state {k} vs torch's formulas with an IEEE sqrt", config)


@pytest.mark.parametrize("config", ["sgd_mom_damp_wd", "sgd_nesterov_wd_max", "adam_amsgrad_wd_max", "adamw"])
def test_float64_kernel_equals_torch(config):
    # float64 as float32: SGD against torch.optim, Adam against torch's formulas with an IEEE sqrt (torch's float64
    # sqrt is MKL's too), bitwise.
    n = 70_001
    if is_adam(config):
        w, states = adam_replica(config, ieee_sqrt, dtype=np.float64, n=n)
    else:
        w, states, _ = torch_run(config, 1, dtype=np.float64, n=n)
    kw, kstates = kernel_run(config, 37_123, dtype=np.float64, n=n)
    compare(kw, w, "float64 weights", config)
    for k, (got, want) in enumerate(zip(kstates, states)):
        compare(got, want, f"float64 state {k}", config)


def test_state_counts_follow_torchs_state():
    assert _p3.num_states({"kind": "torch_sgd"}, "float32") == 0
    assert _p3.num_states({"kind": "torch_sgd", "momentum": 0.9}, "float32") == 1
    assert _p3.num_states({"kind": "torch_adam"}, "float32") == 2
    assert _p3.num_states({"kind": "torch_adam", "amsgrad": True}, "float32") == 3


def test_bfloat16_weights_are_refused_naming_float32():
    # torch's bfloat16 add is not slice-invariant either, and numpy has no bfloat16 for the states.
    for spec in ({"kind": "torch_sgd", "momentum": 0.9}, {"kind": "torch_adam"}):
        with pytest.raises(ValueError, match="float32.*not bfloat16.*worker mode"):
            _p3.num_states(spec, "bfloat16")


def test_flags_torch_refuses_are_refused():
    with pytest.raises(ValueError, match="nesterov"):
        _p3.num_states({"kind": "torch_sgd", "nesterov": True}, "float32")
    with pytest.raises(ValueError, match="unknown optimizer spec field 'betas'"):
        _p3.num_states({"kind": "torch_adam", "betas": (0.9, 0.999)}, "float32")


# float16: torch keeps float16 states and rounds after every operation; add's alpha (and eps) become float16 first.
# torch's own update is not slice-invariant in float16 where it uses add with alpha (SGD; Adam with L2 decay): the
# scalar tail of its vectorised add (the last elements of each loop, fewer than 64) rounds alpha * x to float16
# before adding, the vector body does not (one FMA in float). The kernel computes every element as the vector
# body does. Measured (6 steps, 230,017 elements, 37,123-element pieces): torch's pieces differ from its whole
# tensor in 2 to 6 weights (states likewise), by up to 9 float16 steps (momentum carries the difference on); the
# kernel against torch on the whole tensor: every weight equal, and one momentum element (the last of the first
# thread's range, with 2 threads) 1 step off. Adam without L2 decay: bitwise (torch's float16 sqrt is IEEE).
HALF_TAIL = 64  # elements per vectorised loop that torch may compute with the extra rounding
HALF_TAIL_ULPS = 16  # how far (float16 steps) such an element may drift over the steps here (measured 9)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_float16_torch_slice_invariance(config):
    w, states, _ = torch_run(config, 1, dtype=np.float16)
    pw, pstates, _ = torch_run(config, 1, cut=37_123, dtype=np.float16)
    compare_half(config, pw, pstates, w, states, loops=len(pieces(37_123)) + 1)


def compare_half(config, got_w, got_states, w, states, loops):
    """Bitwise (NaNs equal) where torch's float16 update is slice-invariant; elsewhere at most HALF_TAIL elements
    per vectorised loop of torch's (`loops`) differ, by at most HALF_TAIL_ULPS float16 steps."""
    tails = not is_adam(config) or l2_decay(config)  # torch's add with alpha: not slice-invariant in float16
    named = [("weights", got_w, w)] + [(f"state {k}", a, b) for k, (a, b) in enumerate(zip(got_states, states))]
    for what, got, want in named:
        ulps = half_ulps(got, want)
        if tails:
            assert int((ulps > 0).sum()) <= HALF_TAIL * loops and ulps.max() <= HALF_TAIL_ULPS, \
                (config, what, int((ulps > 0).sum()), int(ulps.max()))
        else:
            assert ulps.max() == 0, (config, what, int((ulps > 0).sum()))


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_float16_kernel_equals_torch(config, threads):
    w, states, _ = torch_run(config, threads, dtype=np.float16)
    kw, kstates = kernel_run(config, 37_123, dtype=np.float16)
    # NaNs count as equal (Adam's eps 1e-8 is 0 in float16: 0/0 where the second moment underflows, in torch as
    # here); their bits may differ where torch's scalar tail returns maximum()'s NaN input.
    compare_half(config, kw, kstates, w, states, loops=threads)
