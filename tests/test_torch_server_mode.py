"""p3kv.torch's server placement (the optimizer on the servers, per slice, with the torch_sgd / torch_adam kernels)
gives the parameters of torch's DistributedDataParallel (gloo) with the same seed, data shards and optimizer;
its optimizer.state_dict() is DDP's optimizer's, gathered from the servers, and a run resumed from it ends where an
uninterrupted one does; what the servers cannot run is refused naming placement='worker'; its servers import
neither torch nor mxnet.

Bitwise with two workers for SGD: each worker multiplies its gradient by 1/2 before the servers' sum, as DDP does
before its all-reduce (a sum of two terms does not depend on the order), and the kernels follow torch's single-tensor
formulas element by element, so a slice ends where torch leaves the same elements of the whole parameter.
float32 Adam/AdamW within ADAM_TOLERANCE, not bitwise: torch 2.13's CPU float32 sqrt (MKL VML on this machine's
AVX512 build) is not correctly rounded (measured: 1 ulp from IEEE sqrt in 1,593 of 10,000 random float32 values) and
the torch_adam kernel uses an IEEE sqrt, so Adam's denominator, and with it the weights, differ in the last bits
(exp_avg and exp_avg_sq of one step are equal; float16 Adam came out bitwise). Two p3kv runs (a resumed one and an
uninterrupted one) are compared bitwise.
"""

from __future__ import annotations

import sys

import pytest
from harness import SCRIPTS
from torch_jobs import ddp_job, p3kv_job

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch", reason="p3kv.torch needs torch (pip install '.[torch]')")

SERVER = ["--placement", "server"]

# Every case runs an LR scheduler (StepLR: lr halved every 2 of the 6 steps, after step()): the servers get each
# new value before the next update.
CASES = {
    "sgd-momentum-wd": ["--optimizer", "sgd"],
    "sgd-nesterov": ["--optimizer", "sgd-nesterov"],
    "sgd-dampening": ["--optimizer", "sgd-dampening"],
    "sgd-maximize": ["--optimizer", "sgd-maximize"],
    "sgd-plain": ["--optimizer", "sgd-plain"],
    "adam": ["--optimizer", "adam"],
    "adam-maximize-betas": ["--optimizer", "adam-maximize"],
    "adamw": ["--optimizer", "adamw"],
    "adamw-amsgrad": ["--optimizer", "adamw-amsgrad"],
    # Layer a in its own param group: half the learning rate, no weight decay (per key on the servers).
    "sgd-groups": ["--optimizer", "sgd", "--groups"],
    "adamw-groups": ["--optimizer", "adamw-amsgrad", "--groups"],
    # OneCycleLR changes lr and momentum / betas[0] at every step: new kernel settings, the states kept.
    "sgd-onecycle": ["--optimizer", "sgd-nesterov", "--scheduler", "onecycle"],
    "adam-onecycle": ["--optimizer", "adam", "--scheduler", "onecycle"],
    # BatchNorm's running statistics go through keys the servers' kernel leaves alone (summed only).
    "adam-batchnorm": ["--optimizer", "adam", "--model", "bn"],
    # Tied weights (one parameter in two modules, one read again outside its module): one key, updated once.
    "sgd-tied": ["--optimizer", "sgd", "--model", "tied"],
    # float16 parameters: the servers sum two float16 gradients in float32 and round once (as gloo's sum of two
    # values), the kernel runs torch's float16 arithmetic.
    "sgd-float16": ["--optimizer", "sgd", "--dtype", "float16"],
    "adam-float16": ["--optimizer", "adam-half", "--dtype", "float16"],
    # Accumulation: two backward passes per step, the first in no_sync().
    "adamw-no_sync": ["--optimizer", "adamw", "--accumulate", "2"],
}


# Six steps of Adam from the same start: observed at most 1.9e-7 (max abs) on weights of magnitude ~0.1-1.
ADAM_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def _differences(a: dict, b: dict) -> dict:
    assert a.keys() == b.keys()
    return {k: float((a[k].double() - b[k].double()).abs().max()) for k in a if not torch.equal(a[k], b[k])}


def _assert_ddps(p3: dict, ddp: dict, args: list) -> None:
    """Bitwise for SGD; within ADAM_TOLERANCE for Adam/AdamW (see the module's docstring)."""
    diff = _differences(p3, ddp)
    print("max abs difference per tensor:", diff)
    if any(a.startswith("adam") for a in args):
        for k in p3:
            torch.testing.assert_close(p3[k], ddp[k], **ADAM_TOLERANCE, msg=k)
    else:
        assert diff == {}, f"differ (max abs difference per tensor): {diff}"


@pytest.mark.parametrize("case", list(CASES))
def test_two_workers_end_with_ddps_parameters(tmp_path, case):
    args = CASES[case]
    result = p3kv_job(tmp_path / "p3kv.pt", *args, *SERVER)
    assert result.returncode == 0, result.stdout
    ddp_job(tmp_path / "ddp.pt", *args)
    _assert_ddps(torch.load(tmp_path / "p3kv.pt"), torch.load(tmp_path / "ddp.pt"), args)
    sums = {line.split()[-1] for line in result.stdout.splitlines() if " checksum " in line}
    assert len(sums) == 1, result.stdout  # both workers hold the same parameters


def _same_state(a, b, where="", tolerance=None) -> list[str]:
    """Where two torch state dicts differ (tensors: dtype and shape, values bit for bit or within `tolerance`)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        ok = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and \
            a.shape == b.shape and (torch.equal(a, b) or (tolerance is not None and torch.allclose(
                a, b, rtol=tolerance["rtol"], atol=tolerance["atol"])))
        return [] if ok else [f"{where}: {a!r} != {b!r}"[:300]]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"]
        return [d for k in a for d in _same_state(a[k], b[k], f"{where}/{k}", tolerance)]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _same_state(x, y, f"{where}[{i}]", tolerance)]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


# The optimizer's state loaded after distribute (sent by load_state_dict) or before it (sent at distribute).
@pytest.mark.parametrize("optimizer, load", [("adamw-amsgrad", "after"), ("sgd", "before")])
def test_state_dict_is_ddps_and_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path, optimizer, load):
    args = ["--optimizer", optimizer, "--groups"]
    # Saved after 3 of 6 steps (worker 0 alone asks the servers), and the run goes on to the end.
    saved = p3kv_job(tmp_path / "full.pt", *args, *SERVER, "--save-at", "3")
    assert saved.returncode == 0, saved.stdout
    ddp_job(tmp_path / "ddp.pt", *args, "--save-at", "3")
    p3_ckpt, ddp_ckpt = torch.load(tmp_path / "full.pt.ckpt"), torch.load(tmp_path / "ddp.pt.ckpt")
    # torch's format, gathered from the servers' slices: DDP's optimizer state ('step' a float32 tensor, as torch
    # keeps it; bit for bit for SGD, within ADAM_TOLERANCE for Adam), the same param_groups.
    tolerance = ADAM_TOLERANCE if optimizer.startswith("adam") else {"rtol": 0, "atol": 0}
    assert _same_state(p3_ckpt["optimizer"], ddp_ckpt["optimizer"], tolerance=tolerance) == []
    assert p3_ckpt["optimizer"]["state"], "no state saved"
    # The run that took the checkpoint ends with DDP's parameters.
    _assert_ddps(torch.load(tmp_path / "full.pt"), torch.load(tmp_path / "ddp.pt"), args)
    # A new job resumed from the checkpoint (the optimizer's state sent to the servers by load_state_dict).
    resumed = p3kv_job(tmp_path / "resumed.pt", *args, *SERVER, "--resume", str(tmp_path / "full.pt.ckpt"),
                       *(["--load-first"] if load == "before" else []))
    assert resumed.returncode == 0, resumed.stdout
    assert "step 2 loss" not in resumed.stdout and "step 3 loss" in resumed.stdout, resumed.stdout
    diff = _differences(torch.load(tmp_path / "resumed.pt"), torch.load(tmp_path / "full.pt"))
    assert diff == {}, diff


# ---- refused, naming placement='worker' ----

def _distribute_refused(model, optimizer, match: str):
    import p3kv.torch
    from p3kv.core.errors import ConfigError

    # Refused before the worker joins a job: no job needed here.
    with pytest.raises(ConfigError, match=match) as e:
        p3kv.torch.distribute(model, optimizer, placement="server")
    assert "placement='worker'" in str(e.value), str(e.value)
    return str(e.value)


@pytest.mark.parametrize("make, match", [
    (lambda ps: torch.optim.RMSprop(ps, lr=0.01), "RMSprop has no server kernel"),
    (lambda ps: torch.optim.LBFGS(ps), "LBFGS has no server kernel"),
    (lambda ps: type("MySGD", (torch.optim.SGD,), {})(ps, lr=0.1), "MySGD has no server kernel"),
    (lambda ps: torch.optim.Adam(ps, differentiable=True), "differentiable=True"),
    (lambda ps: torch.optim.SGD([{"params": ps[:1], "momentum": 0.5}, {"params": ps[1:]}], lr=0.1, momentum=0.9),
     "param_groups 0 and 1 differ in momentum"),
], ids=["rmsprop", "lbfgs", "subclass", "differentiable", "groups-differ"])
def test_what_the_servers_cannot_run_is_refused_naming_worker_placement(make, match):
    model = torch.nn.Linear(3, 2)
    _distribute_refused(model, make(list(model.parameters())), match)


def test_bfloat16_parameters_are_refused_in_server_placement():
    model = torch.nn.Linear(3, 2).to(torch.bfloat16)
    _distribute_refused(model, torch.optim.SGD(model.parameters(), lr=0.1), "'weight' is torch.bfloat16")


MISUSE = {
    # clip_grad_norm_ scales .grad in place after backward() sent it: the servers never see the clipped values.
    "clip-raw": "changed after backward\\(\\) sent it",
    # GradScaler.step would unscale .grad (or skip step() after an inf); the servers have updated already.
    "scaler": "GradScaler.step\\(optimizer\\)",
    # lr changed between backward() and step(): the servers updated with the old one during backward().
    "late-lr": "param_groups changed between backward\\(\\) and step\\(\\)",
}


@pytest.mark.parametrize("misuse", list(MISUSE))
def test_changes_between_backward_and_step_end_the_job_naming_worker_placement(tmp_path, misuse):
    import re

    result = p3kv_job(tmp_path / "out.pt", *SERVER, "--misuse", misuse, "--steps", "3", timeout=120)
    assert result.returncode != 0, result.stdout
    assert re.search(MISUSE[misuse], result.stdout), result.stdout[-4000:]
    assert "placement='worker'" in result.stdout, result.stdout[-4000:]


def test_synchronize_before_clipping_is_refused_in_server_placement(tmp_path):
    result = p3kv_job(tmp_path / "out.pt", *SERVER, "--clip", "0.05", "--steps", "2", timeout=120)
    assert result.returncode != 0, result.stdout
    assert "optimizer.synchronize()" in result.stdout and "use placement='worker'" in result.stdout, \
        result.stdout[-4000:]


# ---- servers know no framework ----

def test_a_server_placement_jobs_servers_run_where_torch_and_mxnet_cannot_be_imported(tmp_path):
    # Each server refuses any import of torch or mxnet (tests/scripts/framework_free_server.py); the job still
    # trains with SGD (momentum, weight decay) on the servers and ends with DDP's parameters.
    args = ["--optimizer", "sgd", "--model", "bn"]
    result = p3kv_job(tmp_path / "p3kv.pt", *args, *SERVER, launcher_args=[
        "--server-command", f"{sys.executable} {SCRIPTS}/framework_free_server.py"])
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("server imported []") == 2, result.stdout
    ddp_job(tmp_path / "ddp.pt", *args)
    _assert_ddps(torch.load(tmp_path / "p3kv.pt"), torch.load(tmp_path / "ddp.pt"), args)


def test_the_launchers_default_servers_serve_a_server_placement_job_too(tmp_path):
    # p3kv.mxnet.server hands the framework-free requests to the core's host on the same SliceOptimizer.
    result = p3kv_job(tmp_path / "p3kv.pt", *SERVER, server_module="mxnet", env={"P3_PRELOAD_MXNET": "0"})
    assert result.returncode == 0, result.stdout
    ddp_job(tmp_path / "ddp.pt")
    assert _differences(torch.load(tmp_path / "p3kv.pt"), torch.load(tmp_path / "ddp.pt")) == {}
