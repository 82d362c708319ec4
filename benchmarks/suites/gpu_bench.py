"""p3kv.torch on a real GPU with a real network: two workers on one GPU, trained by p3kv (both placements, the CUDA
staging path), by DDP (gloo) and by nothing (each process alone), side by side in one session.

    python -m benchmarks.suites.gpu_bench --out DIR    # on the lent GPU (tests/gpu/run_gpu_check.sh --bench runs it)
    python -m benchmarks.suites.gpu_bench --device cpu --image-size 32 --batch-size 2 --iters 3 --out DIR   # dry run

What it answers: what the staging path costs a real training loop (its thread's CPU per iteration; the iteration
time against the same two processes exchanging nothing), and where p3kv stands beside DDP on the same GPU. Both
workers share the one GPU and talk over loopback, so there is no network limit: these rows say nothing of what
P3 gains on a cluster (that is the emulated cluster's job, benchmarks/suites/sweeps.py).

Jobs run interleaved (round r runs every system once, in an order rotated per round), each model's rounds until
--repeats or until --budget-s has passed (no job starts after it), and write one row each to DIR/gpu_bench.csv with
the conditions (GPU, torch, CPUs, commit); DIR/gpu_bench.md gives each system's images/s with a 95% bootstrap CI
over jobs and iterations (benchmarks/analysis/bootstrap.py), the ratios, and whether p3kv's final weights are
DDP's bit for bit.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import logging
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

from benchmarks.analysis import bootstrap
from benchmarks.emulation import run_guard
from benchmarks.workloads import torch_models
from p3kv.launch.launcher import free_port

LOG = logging.getLogger("gpu_bench")
ROOT = pathlib.Path(__file__).resolve().parents[2]
SYSTEMS = ("local", "p3kv-worker", "p3kv-server", "ddp")
WORKERS = SERVERS = 2
FIELDS = ("timestamp", "commit", "model", "system", "device", "device_name", "workers", "servers", "batch_size",
          "image_size", "warmup", "iters", "round", "position", "status", "median_s", "images_per_s",
          "process_cpu_s_per_iter", "staging_cpu_s_per_iter", "checksum", "state_sha256", "wall_s", "cpus", "torch",
          "python", "iter_s_by_rank", "detail")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("P3_", "DMLC_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.update(PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME="lo", **extra)
    return env


def job_argv(system: str, worker_args: list[str], timeout: float) -> list[list[str]]:
    """The processes one job starts (all at once): p3kv through its launcher, DDP through torchrun, `local` as two
    plain processes with RANK and LOCAL_RANK set."""
    py = sys.executable
    module = ["-m", "benchmarks.workloads.gpu_worker"]
    if system.startswith("p3kv"):
        launcher = [py, "-m", "p3kv.launch", "-n", str(WORKERS), "-s", str(SERVERS), "--servers", "core",
                    "--timeout", str(max(10, int(timeout) - 10))]  # the launcher cleans up before we kill it
        return [[*launcher, "--", py, *module, "--system", "p3kv", "--placement", system.split("-")[1],
                 *worker_args]]
    if system == "ddp":
        return [[py, "-m", "torch.distributed.run", "--nproc-per-node", str(WORKERS), "--master-addr", "127.0.0.1",
                 "--master-port", str(free_port("127.0.0.1")), *module, "--system", "ddp", *worker_args]]
    return [[py, *module, "--system", "local", *worker_args] for _ in range(WORKERS)]


def run_job(system: str, worker_args: list[str], prefix: str, timeout: float) -> tuple[list[dict], str]:
    """Runs one job to its end; (each rank's result, the output's tail when something failed)."""
    procs = []
    log_path = f"{prefix}.log"
    with open(log_path, "w") as log:
        for i, argv in enumerate(job_argv(system, [*worker_args, "--out", prefix], timeout)):
            extra = {"RANK": str(i), "LOCAL_RANK": str(i), "WORLD_SIZE": str(WORKERS)} if system == "local" else {}
            procs.append(subprocess.Popen(argv, cwd=ROOT, env=_env(**extra), stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for rank in range(WORKERS):
        path = pathlib.Path(f"{prefix}.rank{rank}.json")
        if path.exists():
            results.append(json.loads(path.read_text()))
    failed = len(results) < WORKERS or any(p.returncode not in (0, None) for p in procs)
    tail = pathlib.Path(log_path).read_text()[-3000:] if failed else ""
    return results, tail


def commit() -> str:
    """The tree's commit as the run guard records it (the carried manifest's on a device), marked when dirty."""
    sha, dirty = run_guard.git_state(ROOT)
    return sha[:12] + (" (tree differs from it)" if dirty else "")


def row_of(system: str, results: list[dict], detail: str, args, model: str, round_: int, position: int,
           wall: float, sha: str) -> dict:
    import torch

    ok = len(results) == WORKERS and not detail
    first = results[0] if results else {}
    median = float(np.median([t for r in results for t in r["iter_s"]])) if ok else None

    def mean(key):
        values = [r[key] for r in results if r.get(key) is not None]
        return f"{sum(values) / len(values):.5f}" if values else ""

    return {"timestamp": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z"),
            "commit": sha, "model": model, "system": system, "device": args.device,
            "device_name": first.get("device_name", ""), "workers": WORKERS,
            "servers": SERVERS if system.startswith("p3kv") else 0, "batch_size": args.batch_size,
            "image_size": args.image_size, "warmup": args.warmup, "iters": args.iters, "round": round_,
            "position": position, "status": "ok" if ok else "failed", "median_s": f"{median:.5f}" if ok else "",
            "images_per_s": f"{WORKERS * args.batch_size / median:.2f}" if ok else "",
            "process_cpu_s_per_iter": mean("process_cpu_s_per_iter"),
            "staging_cpu_s_per_iter": mean("staging_cpu_s_per_iter"),
            "checksum": f"{first['checksum']:.10g}" if ok else "",
            "state_sha256": first["state_sha256"][:16] if ok else "", "wall_s": f"{wall:.1f}", "cpus": os.cpu_count(),
            "torch": torch.__version__, "python": sys.version.split()[0],
            "iter_s_by_rank": json.dumps([r["iter_s"] for r in results]) if ok else "",
            "detail": detail.replace("\n", " | ")[-1500:]}


def summary(rows: list[dict]) -> str:
    """The markdown summary: per model, each system's throughput with its CI, its ratio to DDP and to `local`,
    the staging thread's CPU, and whether p3kv's final state is DDP's bit for bit (SHA-256 digests)."""
    lines = ["# p3kv.torch on one GPU: two workers, a real network (generated by benchmarks/suites/gpu_bench.py)", ""]
    ok = [r for r in rows if r["status"] == "ok"]
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in ok if r["model"] == model]
        failed = sum(1 for r in rows if r["model"] == model and r["status"] != "ok")
        if not mine:
            lines += [f"## {model}: no job finished ({failed} failed)", ""]
            continue
        first = mine[0]
        lines += [f"## {model}", "",
                  f"{first['device_name']}, {first['workers']} workers on it, batch {first['batch_size']} per worker "
                  f"({first['image_size']}x{first['image_size']} images), {first['iters']} timed iterations after "
                  f"{first['warmup']}; {first['cpus']} CPUs, torch {first['torch']}, commit {first['commit']}; "
                  f"{len(mine)} jobs finished, {failed} failed.", "",
                  "| system | jobs | images/s (95% CI) | vs DDP | vs local | process CPU s/iter | staging thread "
                  "CPU s/iter |", "|---|---|---|---|---|---|---|"]
        jobs = {s: [np.array(json.loads(r["iter_s_by_rank"])).T for r in mine if r["system"] == s] for s in SYSTEMS}
        samples = WORKERS * int(first["batch_size"])
        for s in SYSTEMS:
            if not jobs[s]:
                continue
            t = bootstrap.throughput(jobs[s], samples)

            def vs(other, s=s, jobs=jobs, samples=samples):
                if not jobs[other] or other == s:
                    return "-"
                r = bootstrap.ratio(jobs[s], jobs[other], samples, samples)
                return f"{r.value:.2f}x ({r.low:.2f}-{r.high:.2f})"

            cpu = [float(r["process_cpu_s_per_iter"]) for r in mine if r["system"] == s]
            staging = [float(r["staging_cpu_s_per_iter"]) for r in mine
                       if r["system"] == s and r["staging_cpu_s_per_iter"]]
            lines.append(f"| {s} | {len(jobs[s])} | {t.value:.1f} ({t.low:.1f}-{t.high:.1f}) | {vs('ddp')} | "
                         f"{vs('local')} | {np.mean(cpu):.4f} | "
                         f"{f'{np.mean(staging):.4f}' if staging else '-'} |")
        digests = {s: sorted({r["state_sha256"] for r in mine if r["system"] == s}) for s in SYSTEMS}
        lines += ["", "Final parameters and buffers of worker 0 (SHA-256, first 16 hex digits, each job's): "
                  + "; ".join(f"{s} {', '.join(v)}" for s, v in digests.items() if v) + "."]
        if digests["p3kv-worker"] and digests["ddp"]:
            same = digests["p3kv-worker"] == digests["ddp"] and len(digests["ddp"]) == 1
            lines.append(f"p3kv's worker placement {'ended with' if same else 'did not end with'} DDP's state bit "
                         "for bit in every job" + ("." if same else " (cuDNN's backward kernels need not be "
                                                   "deterministic from run to run: compare DDP's jobs with each "
                                                   "other)."))
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--models", nargs="+", choices=torch_models.MODELS, default=["resnet50_v1"])
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=300.0, help="no job starts after this many seconds")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--job-timeout", type=float, default=180.0)
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "build" / "gpu-bench"))
    p.add_argument("--jobs-dir", help="each job's log and result files (default OUT/jobs; the device tool brings "
                   "back only a few files, so its runs put them elsewhere)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out = pathlib.Path(args.out)
    jobs_dir = pathlib.Path(args.jobs_dir) if args.jobs_dir else out / "jobs"
    jobs_dir.mkdir(parents=True, exist_ok=True)

    def worker_args(model: str, system: str) -> list[str]:
        wa = ["--model", model, "--device", args.device, "--batch-size", str(args.batch_size), "--image-size",
              str(args.image_size), "--warmup", str(args.warmup), "--iters", str(args.iters)]
        if args.device == "cpu":  # the dry run: one thread per process, p3kv through the staging path's double
            wa += ["--threads", "1", *(["--staging", "double"] if system.startswith("p3kv") else [])]
        return wa

    sha, started, rows = commit(), time.monotonic(), []
    for model in args.models:
        for round_ in range(args.repeats):
            order = args.systems[round_ % len(args.systems):] + args.systems[:round_ % len(args.systems)]
            for position, system in enumerate(order):
                if time.monotonic() - started > args.budget_s:
                    LOG.info("budget of %.0f s spent: no more jobs", args.budget_s)
                    break
                t0 = time.monotonic()
                prefix = str(jobs_dir / f"{model}.{system}.r{round_}")
                results, detail = run_job(system, worker_args(model, system), prefix, args.job_timeout)
                rows.append(row_of(system, results, detail, args, model, round_, position, time.monotonic() - t0,
                                   sha))
                LOG.info("%s %s round %d: %s, %s images/s, staging CPU %s s/iter (%.0f s)", model, system, round_,
                         rows[-1]["status"], rows[-1]["images_per_s"] or "-", rows[-1]["staging_cpu_s_per_iter"]
                         or "-", time.monotonic() - t0)
            # Rows are written after every round: a run cut off by its time limit keeps what it measured.
            with open(out / "gpu_bench.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=FIELDS)
                w.writeheader()
                w.writerows(rows)
            (out / "gpu_bench.md").write_text(summary(rows))
    print(summary(rows))
    return 0 if rows and all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
