"""The PyTorch benchmark's worker and loopback bench in real jobs over loopback: benchmarks/workloads/torch_worker.py
as a 2-worker p3kv.torch job in both placements (the launcher, framework-free servers) and as a 2-rank DDP job
(torchrun, gloo), and benchmarks/suites/torch_loopback_bench.py's smallest run.

With --real the emulated model's gradients depend on the weights its forward read and every system runs torch's
SGD (momentum, weight decay) where it runs it in the benchmark: the three end with the same weights, bit for bit
(two workers: each gradient times 1/2, then a sum of two terms), equal to SGD on the averaged gradients computed
here in one process. That is the work the timed runs do (the sums, the updates' placement), not a model of it.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json

import numpy as np
import pytest
from torch_bench_jobs import TINY, ddp_job, p3kv_job, rank_results, tiny_description

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch", reason="the PyTorch benchmark needs torch (pip install '.[torch]')")

from benchmarks.emulation import emulated_compute, torch_compute  # noqa: E402
from benchmarks.suites import torch_loopback_bench  # noqa: E402

STEPS = 4  # --warmup 1 --iters 3 (torch_bench_jobs.worker_args)
RANK_FIELDS = {"rank", "num_workers", "mode", "model", "optimizer", "update_on", "update_placement", "update_s",
               "vgpu_late_max_us", "vgpu_forgiven_us_per_iter", "vgpu_idle_us_per_iter", "compute", "batch_size",
               "samples_per_batch", "unit", "compute_s", "iter_s", "median_s", "checksum", "versions"}


def _reference() -> dict:
    """SGD (lr 0.01, momentum 0.9, wd 1e-4) on the average of the two ranks' gradients, in one process."""
    profile = emulated_compute.Profile("p100", 1.0, emulated_compute.efficiency_of(TINY))
    nets = [torch_compute.EmulatedNet(TINY, 4, profile, rank, real=True) for rank in range(2)]
    weights = [p.detach().clone() for p in nets[0].parameters()]
    bases = [[g for layer in net.layers for g in layer._grads] for net in nets]
    optimizer = torch.optim.SGD(weights, lr=0.01, momentum=0.9, weight_decay=1e-4, foreach=False)
    for _ in range(STEPS):
        for i, w in enumerate(weights):
            grads = [base[i] + torch_compute.WEIGHT_COUPLING * w for base in bases]
            w.grad = grads[0] * 0.5 + grads[1] * 0.5
        optimizer.step()
    names = [name for name, _ in nets[0].named_parameters()]
    return dict(zip(names, weights))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each system's job with --real --save: (its output, its ranks' results, worker 0's final weights)."""
    folder = tmp_path_factory.mktemp("torch_bench")
    description = tiny_description(folder)
    out = {}
    for system in ("torch-p3kv", "torch-p3kv-server", "ddp"):
        prefix = folder / system
        save = folder / f"{system}.pt"
        extra = ("--real", "--save", str(save))
        if system == "ddp":
            done = ddp_job(description, prefix, *extra)
        else:
            done = p3kv_job(description, prefix, "server" if system.endswith("server") else "worker", *extra)
        assert done.returncode == 0, f"{system}:\n{done.stdout[-4000:]}"
        out[system] = (done.stdout, rank_results(prefix), torch.load(save))
    return out


@pytest.mark.parametrize("system", ["torch-p3kv", "torch-p3kv-server", "ddp"])
def test_each_system_runs_two_workers_and_writes_every_field_the_rows_take(runs, system):
    output, results, _ = runs[system]
    assert sorted(r["rank"] for r in results) == [0, 1], output[-3000:]
    for r in results:
        assert RANK_FIELDS <= set(r), RANK_FIELDS - set(r)
        assert r["num_workers"] == 2 and len(r["iter_s"]) == 3 and r["median_s"] > 0
        assert r["optimizer"] == "sgd(lr=0.01,momentum=0.9,wd=0.0001,grad/2 before the sum)"
        assert r["versions"]["torch"] == importlib.metadata.version("torch")
        if system == "torch-p3kv-server":
            assert (r["update_on"], r["update_placement"], r["update_s"]) == ("servers", "servers (CPU)", 0.0)
            # Its copy of the new weights into the parameters: 2 passes on the virtual GPU, not the host's memcpy.
            assert r["weight_copy"] == "virtual GPU"
            assert r["weight_copy_s"] == pytest.approx(2 / 5 * runs["torch-p3kv"][1][0]["update_s"])
        else:  # the workers' update: on the virtual GPU at its memory bandwidth
            assert r["update_on"] == "workers" and r["update_placement"] == "workers (virtual GPU, 732 GB/s x 1)"
            assert r["update_s"] > 0 and (r["weight_copy"], r["weight_copy_s"]) == ("", 0.0)
        # The system's own passes over the gradients during backward, on the virtual GPU (gradient_work.py): DDP's
        # copies into its buckets and back (2 passes each), p3kv.torch's 1/W scaling into its send buffers (2).
        nbytes = sum(int(np.prod(p["shape"])) * torch.empty(0, dtype=torch_compute.DTYPES[p["dtype"]]).element_size()
                     for p in TINY["params"])
        passes = 4 if system == "ddp" else 2
        assert r["gradient_work"] == "virtual GPU" and r["gradient_work_bytes"] == passes * nbytes, r
        assert r["gradient_work_s"] == pytest.approx(passes * nbytes / 732e9) and r["gradient_work_ops"] > 0
    assert "iter 2:" in output  # the progress lines the cluster runner relays
    if system == "ddp":
        assert results[0]["ddp_buckets"] == "25 MiB, the first 1 MiB (default)"


def test_every_system_ends_with_the_weights_of_sgd_on_the_averaged_gradients(runs):
    states = {system: run[2] for system, run in runs.items()}
    ddp = states["ddp"]
    for system in ("torch-p3kv", "torch-p3kv-server"):
        differ = {k: float((v - ddp[k]).abs().max()) for k, v in states[system].items() if not torch.equal(v, ddp[k])}
        assert not differ, f"{system} differs from DDP: {differ}"
    reference = _reference()
    assert ddp.keys() == reference.keys()
    initial = torch_compute.EmulatedNet(TINY, 4, emulated_compute.Profile(), 0, real=True).state_dict()
    for name, w in reference.items():
        assert torch.allclose(ddp[name], w, rtol=1e-6, atol=1e-7), name
        assert not torch.allclose(ddp[name], initial[name], rtol=1e-4, atol=0), name  # the weights did move
    # The ranks' checksums of their final weights agree within each job, and across jobs.
    checksums = {round(r["checksum"], 6) for _, results, _ in runs.values() for r in results}
    assert len(checksums) == 1, checksums


def test_the_loopback_bench_sums_the_same_arrays_in_both_systems(tmp_path):
    description = tiny_description(tmp_path)
    out = tmp_path / "loopback.csv"
    code = torch_loopback_bench.main(["--description", str(description), "--model", "tiny", "--workers", "2",
                                      "--repeats", "2", "--warmup", "1", "--iters", "3", "--force",
                                      "--allow-dirty", "--csv", str(out), "--timeout", "120"])
    assert code == 0
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["system"] for r in rows) == ["gloo", "gloo", "p3kv", "p3kv"]
    assert all(r["status"] == "ok" and r["forced"] in ("True", "False") for r in rows), rows
    assert [len(t) for r in rows for t in json.loads(r["rank_iter_s"])] == [3] * 8
    sizes = sum(4 * int(torch.tensor(p["shape"]).prod()) for p in TINY["params"])
    assert {int(r["bytes"]) for r in rows} == {sizes}
    assert len({r["checksum"] for r in rows}) == 1  # both systems' sums, every rank, every job
    summary = out.with_suffix(".md").read_text()
    assert "p3kv / gloo:" in summary and "Sums: equal in every job and system" in summary
