"""The GPU check of p3kv.torch's CUDA path (p3kv.torch.cuda_staging), for a lent accelerator: run by
tests/gpu/run_gpu_check.sh after it has built the extension. Not a pytest module (CI has no GPU; tests/conftest.py keeps
pytest out of this folder).

Jobs of tests/scripts/torch_train.py, two workers and two framework-free servers (python -m p3kv.launch --servers
core), both workers on the one GPU (cuda:0), compared with the same training elsewhere:

- p3kv, worker placement, on the device == 2-process DDP (gloo) on the device, bit for bit (SGD with momentum and
  weight decay, no BatchNorm): the same CUDA kernels on both sides, and the sum of two terms is order-free.
- p3kv, BatchNorm model, on the device == DDP on the device, bit for bit (buffers broadcast from worker 0 as DDP).
- p3kv in float16, bfloat16, with Adam, and with AdamW accumulating in no_sync, on the device == DDP on the device,
  bit for bit (tests/test_torch_ddp.py's cases on CUDA tensors).
- p3kv, server placement, on the device vs DDP on the device: within rtol 1e-5, atol 1e-6 (the servers run torch's
  CPU formulas, the reference torch's CUDA kernels, which may fuse a multiply and an add).
- p3kv, worker placement, on the device vs the same p3kv job on CPU tensors: within rtol 1e-4, atol 1e-5 (the
  forward and backward passes run cuBLAS on one side and the CPU's GEMM on the other: not the same roundings).
- timing: iterations/s of p3kv on the device and on the CPU, and of DDP on the device (a model with a 10 M-parameter
  last layer, 30 steps; one machine, loopback: a check of the staging path's speed, not of what P3 gains).

With --device cpu (the dry run, on any machine) the "device" jobs run CPU models through the staging path's CPU
double (p3kv.torch.stream_double), and every comparison is bit for bit.

Writes DIR/gpu_check.csv (one row per check) and prints one line per check; exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "tests", "scripts", "torch_train.py")
sys.path.insert(0, os.path.join(ROOT, "tests"))
from torch_cases import DDP_CASES  # noqa: E402  (tests/ is no package)

JOB_TIMEOUT_S = 150


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("P3_", "DMLC_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def p3kv_job(out: str, args: list[str], slice_size: int = 1000) -> str:
    """The training script as a p3kv.torch job (2 workers, 2 core servers) through the launcher; its output."""
    argv = [sys.executable, "-m", "p3kv.launch", "-n", "2", "-s", "2", "--servers", "core", "--timeout",
            str(JOB_TIMEOUT_S - 10), "--", sys.executable, TRAIN, "p3kv", out, *args]
    result = subprocess.run(argv, cwd=ROOT, env=_env(P3_SLICE_SIZE=str(slice_size)), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=JOB_TIMEOUT_S)
    if result.returncode != 0:
        raise RuntimeError(f"p3kv job {' '.join(args)} exited {result.returncode}:\n{result.stdout[-4000:]}")
    return result.stdout


def ddp_job(out: str, args: list[str]) -> str:
    """The training script as 2-process DDP (gloo; on CUDA tensors with --device cuda); rank 0's output. Output
    goes to files: a rank blocked on a full pipe would stall the other in a collective."""
    port = free_port()
    procs, logs = [], []
    deadline = time.monotonic() + JOB_TIMEOUT_S
    try:
        for rank in range(2):
            env = _env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            logs.append(open(f"{out}.rank{rank}.log", "w+"))
            procs.append(subprocess.Popen([sys.executable, TRAIN, "ddp", out, *args], cwd=ROOT, env=env,
                                          stdin=subprocess.DEVNULL, stdout=logs[-1], stderr=subprocess.STDOUT))
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass  # reported below (no checksum)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
            log.close()
    # gloo's teardown sometimes aborts after the work is done (tests/torch_jobs.py): the checksum line counts.
    if not all(p.returncode == 0 or re.search(r"^rank \d+ checksum ", o, re.M) for p, o in zip(procs, outputs)):
        raise RuntimeError(f"DDP job {' '.join(args)} failed:\n" + "\n".join(o[-3000:] for o in outputs))
    return outputs[0]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for DDP's store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def compare(a_path: str, b_path: str, rtol: float | None, atol: float | None) -> tuple[bool, float, str]:
    """(equal bit for bit, or within rtol/atol when given; the largest absolute difference; what differs)."""
    import torch

    a, b = torch.load(a_path, map_location="cpu"), torch.load(b_path, map_location="cpu")
    if a.keys() != b.keys():
        return False, float("nan"), f"keys differ: {sorted(a.keys() ^ b.keys())}"
    worst, differing = 0.0, []
    for k in a:
        if not torch.equal(a[k], b[k]):
            diff = float((a[k].double() - b[k].double()).abs().max())
            worst = max(worst, diff)
            if rtol is None or not torch.allclose(a[k].double(), b[k].double(), rtol=rtol, atol=atol):
                differing.append(f"{k} ({diff:.3g})")
    return not differing, worst, ", ".join(differing[:4])


def rates(output: str) -> list[float]:
    return [float(x) for x in re.findall(r"rank \d+ iterations_per_s ([0-9.]+)", output)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "build", "gpu-check"))
    p.add_argument("--timing-steps", type=int, default=30)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("FAIL: torch.cuda.is_available() is False: no GPU here (use --device cpu for the dry run)")
            return 2
        on_device = ddp_device = ["--device", "cuda"]
        exact = False  # comparisons across kernels get the stated tolerance
    else:
        on_device, ddp_device = ["--staging", "double"], []
        exact = True
    files = os.path.join(args.out, "states")
    os.makedirs(files, exist_ok=True)

    def path(name: str) -> str:
        return os.path.join(files, f"{name}.pt")

    rows: list[dict] = []

    def check(name: str, placement: str, model: str, run, rtol: float | None = None, atol: float | None = None):
        started = time.monotonic()
        expectation = "bitwise" if rtol is None else f"rtol={rtol:g},atol={atol:g}"
        try:
            a, b = run()
            ok, worst, detail = compare(a, b, rtol, atol)
            result = "pass" if ok else "FAIL"
        except Exception as e:  # one broken job must not hide the others' results
            ok, worst, detail, result = False, float("nan"), str(e)[-1500:], "ERROR"
        rows.append({"check": name, "device": args.device, "placement": placement, "model": model,
                     "expectation": expectation, "result": result, "max_abs_diff": f"{worst:.3g}",
                     "iterations_per_s": "", "seconds": f"{time.monotonic() - started:.1f}", "detail": detail})
        print(f"{result}: {name} ({expectation}; max |difference| {worst:.3g}; "
              f"{time.monotonic() - started:.1f} s){': ' + detail if detail else ''}", flush=True)

    base = ["--steps", "6"]

    def worker_vs_ddp():
        out = p3kv_job(path("p3kv-device-worker"), [*base, *on_device])
        if args.device == "cuda" and len(re.findall(r"rank \d device cuda", out)) != 2:
            raise RuntimeError(f"the workers did not report training on CUDA:\n{out[-3000:]}")
        ddp_job(path("ddp-device"), [*base, *ddp_device])
        return path("p3kv-device-worker"), path("ddp-device")

    check("p3kv worker placement on the device == DDP (gloo) on the device", "worker", "reversed", worker_vs_ddp)

    def batchnorm_vs_ddp():
        p3kv_job(path("p3kv-device-bn"), [*base, "--model", "bn", *on_device])
        ddp_job(path("ddp-device-bn"), [*base, "--model", "bn", *ddp_device])
        return path("p3kv-device-bn"), path("ddp-device-bn")

    check("p3kv with BatchNorm on the device == DDP (gloo) on the device", "worker", "bn", batchnorm_vs_ddp)

    # More of tests/test_torch_ddp.py's cases, on the device: half precision (the servers sum in float32 and round
    # once), Adam, and accumulation in no_sync. Both sides step one parameter at a time (foreach=False).
    for case in ("float16", "bfloat16", "adam", "adamw-no_sync"):
        extra = DDP_CASES[case]

        def case_vs_ddp(case=case, extra=extra):
            p3kv_job(path(f"p3kv-device-{case}"), [*base, *extra, *on_device])
            ddp_job(path(f"ddp-device-{case}"), [*base, *extra, *ddp_device])
            return path(f"p3kv-device-{case}"), path(f"ddp-device-{case}")

        check(f"p3kv {case} on the device == DDP (gloo) on the device", "worker", "reversed", case_vs_ddp)

    def server_vs_ddp():
        p3kv_job(path("p3kv-device-server"), [*base, "--placement", "server", *on_device])
        if not os.path.exists(path("ddp-device")):
            ddp_job(path("ddp-device"), [*base, *ddp_device])
        return path("p3kv-device-server"), path("ddp-device")

    check("p3kv server placement on the device vs DDP (gloo) on the device", "server", "reversed", server_vs_ddp,
          *((None, None) if exact else (1e-5, 1e-6)))

    def device_vs_cpu():
        p3kv_job(path("p3kv-cpu-worker"), base)
        if not os.path.exists(path("p3kv-device-worker")):
            p3kv_job(path("p3kv-device-worker"), [*base, *on_device])
        return path("p3kv-device-worker"), path("p3kv-cpu-worker")

    check("p3kv worker placement on the device vs the same job on CPU tensors", "worker", "reversed", device_vs_cpu,
          *((None, None) if exact else (1e-4, 1e-5)))

    timing = {}
    timed = (("p3kv", "device", args.device, lambda a: p3kv_job(os.devnull, [*a, *on_device], slice_size=50_000)),
             ("p3kv", "cpu", "cpu", lambda a: p3kv_job(os.devnull, a, slice_size=50_000)),
             ("ddp", "device", args.device, lambda a: ddp_job(path("ddp-timing"), [*a, *ddp_device])))
    for system, where, device, job in timed:
        started = time.monotonic()
        try:
            per_worker = rates(job(["--model", "wide", "--steps", str(args.timing_steps), "--timing"]))
            rate = sum(per_worker) / len(per_worker) if per_worker else float("nan")
            result, detail = ("pass" if per_worker else "ERROR"), ""
        except Exception as e:
            rate, result, detail = float("nan"), "ERROR", str(e)[-1500:]
        timing[system, where] = rate
        name = "DDP (gloo)" if system == "ddp" else "p3kv worker placement"
        rows.append({"check": f"timing {name} ({where})", "device": device,
                     "placement": "worker" if system == "p3kv" else "", "model": "wide", "expectation": "",
                     "result": result, "max_abs_diff": "", "iterations_per_s": f"{rate:.3f}",
                     "seconds": f"{time.monotonic() - started:.1f}", "detail": detail})
    label = "cuda:0" if args.device == "cuda" else "cpu via the staging double"
    print(f"timing: p3kv (worker placement, 2 workers, 2 servers, the 'wide' model of 10.9 M parameters, "
          f"{args.timing_steps} steps) "
          f"{timing['p3kv', 'device']:.2f} iterations/s on {label}, {timing['p3kv', 'cpu']:.2f} iterations/s on CPU "
          f"tensors; "
          f"2-process DDP (gloo) {timing['ddp', 'device']:.2f} iterations/s on {label.split()[0]} "
          f"(one machine: loopback, no network limit, so this says the staging path works at speed, "
          f"not what P3 gains)", flush=True)
    with open(os.path.join(args.out, "gpu_check.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    failed = [r["check"] for r in rows if r["result"] != "pass"]
    print(f"{len(rows) - len(failed)} of {len(rows)} checks passed; wrote {os.path.join(args.out, 'gpu_check.csv')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
