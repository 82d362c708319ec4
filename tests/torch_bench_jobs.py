"""The PyTorch benchmark's jobs for tests/test_torch_bench*.py: a tiny shape file, and benchmarks/workloads/
torch_worker.py over loopback as a 2-worker p3kv.torch job (the launcher, framework-free servers) or a DDP job
(torchrun --standalone, gloo)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness import REPO, launcher_env, run_job

WORKER = ["-m", "benchmarks.workloads.torch_worker"]
# Three layers in forward order; the middle array spans 3 slices of 1,000 elements (P3_SLICE_SIZE below), so a key
# is cut and its slices spread over both servers.
TINY = {
    "model": "tiny",
    "params": [{"name": "l0_weight", "shape": [16, 8], "dtype": "float32"},
               {"name": "l0_bias", "shape": [16], "dtype": "float32"},
               {"name": "l1_weight", "shape": [2500], "dtype": "float32"},
               {"name": "l2_weight", "shape": [4, 16], "dtype": "float32"}],
    "layers": [{"name": "l0", "params": [0, 1], "fwd_flops": 2_000_000},
               {"name": "l1", "params": [2], "fwd_flops": 3_000_000},
               {"name": "l2", "params": [3], "fwd_flops": 1_000_000}],
}


def tiny_description(folder: Path) -> Path:
    path = folder / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


def env() -> dict[str, str]:
    return {**launcher_env(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "lo"}


def worker_args(description: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", "tiny", "--description", str(description), "--batch-size", "4", "--warmup", "1",
            "--iters", "3", "--log-interval", "1", "--out", str(out), *extra]


def p3kv_job(description: Path, out: Path, placement: str, *extra: str, timeout: float = 180
             ) -> subprocess.CompletedProcess:
    """2 workers, 2 framework-free servers (the launcher's --servers core), slices of 1,000 elements."""
    return run_job(2, 2, [*WORKER, *worker_args(description, out, "--system", "p3kv", "--placement", placement,
                                                *extra)],
                   env={**env(), "P3_SLICE_SIZE": "1000"}, timeout=timeout,
                   launcher_args=["--servers", "core", "--timeout", str(timeout - 10)])


def ddp_job(description: Path, out: Path, *extra: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """2 DDP ranks under torchrun --standalone (gloo on loopback)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "--monitor-interval", "1", *WORKER, *worker_args(description, out, "--system", "ddp", *extra)]
    return subprocess.run(argv, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, check=False)


def rank_results(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.parent.glob(f"{out.name}.rank*.json"))]
