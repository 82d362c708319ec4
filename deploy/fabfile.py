"""Fabric tasks that deploy p3kv to the machines of a hosts file (see hosts.example and the README).

    fab -r deploy install --hosts-file hosts          # (or: cd deploy && fab install ...)
    fab -r deploy launch --command "python train.py --kvstore p3"
    fab -r deploy bandwidth --rate 10gbit
    fab -r deploy bench --model resnet50_v1 --repeats 3   # p3kv vs dist_sync vs MXNet's P3 vs Horovod, real compute
    fab -r deploy status | logs | stop | transport

Fabric's own options apply to every connection, e.g. ``fab -i ~/.ssh/cluster_key -t 5 ...`` (key, connect
timeout). Each task exits non-zero with one line per failed host saying what to do.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys

from fabric import task
from invoke.exceptions import Exit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import deploy  # noqa: E402 (needs the repository root on sys.path, set just above)
from deploy.compare import refused  # noqa: E402
from deploy.install import DEFAULT_PATH  # noqa: E402
from deploy.job import DEFAULT_PORT  # noqa: E402
from deploy.state import DEFAULT_STATE_DIR  # noqa: E402

LOG = logging.getLogger("p3kv.deploy")
HOSTS_HELP = "the hosts file (default: hosts; see hosts.example)"
PATH_HELP = f"where the project lives on every host (default {DEFAULT_PATH})"


def _setup(ctx, hosts_file: str):
    logging.basicConfig(format="%(name)s: %(levelname)s: %(message)s", level=logging.INFO)
    logging.getLogger("paramiko").setLevel(logging.WARNING)
    try:
        hosts = deploy.read_hosts_file(hosts_file)
    except deploy.HostsFileError as e:
        raise Exit(str(e), code=2) from None
    return hosts, deploy.default_connect(ctx.config, int(ctx.config.timeouts.connect or 10))


def _call(fn, *args, **kwargs):
    """fn(*args, **kwargs), with deploy's errors turned into a message and a non-zero exit."""
    try:
        return fn(*args, **kwargs)
    except deploy.DeployError as e:
        raise Exit(str(e), code=1) from None
    except (ValueError, FileNotFoundError) as e:
        raise Exit(str(e), code=2) from None


def _job(state_dir: str, job: str | None):
    return _call(deploy.JobState.load, state_dir, job)


@task(help={"hosts_file": HOSTS_HELP, "path": PATH_HELP,
            "venv": "use this existing virtualenv on the hosts instead of creating PATH/.venv",
            "python": "the Python that creates PATH/.venv (default python3)",
            "mxnet": "pip install MXNet into the virtualenv: cpu (default for a new one), cu112 or none",
            "prebuilt": "ship this machine's built C++ extension instead of building it on every host",
            "system_site_packages": "create PATH/.venv with --system-site-packages",
            "horovod": "also build Horovod 0.28.1 with MXNet and Gloo into the virtualenv (fab bench's fourth "
            "system; needs g++, and CMake 3 or the package index)"})
def install(ctx, hosts_file="hosts", path=DEFAULT_PATH, venv=None, python="python3", mxnet=None, prebuilt=False,
            system_site_packages=False, horovod=False):
    """Copy the project to every host, give it a virtualenv, build p3kv (and Horovod) and check it imports."""
    hosts, connect = _setup(ctx, hosts_file)
    done = _call(deploy.install, hosts, connect, path=path, venv=venv, python=python, mxnet=mxnet,
                 prebuilt=prebuilt, system_site_packages=system_site_packages, horovod=horovod)
    for label, result in done.items():
        extra = f", horovod {result.horovod}" if result.horovod else ""
        print(f"{label}: {result.path} with {result.python} (mxnet {result.mxnet}{extra})"
              f"{'' if result.copied else ', shared filesystem: not copied again'}")


_LAUNCH_HELP = {"hosts_file": HOSTS_HELP, "path": PATH_HELP,
                "kvstore": "p3 (default), dist_sync or mxnet-p3 (MXNet's parameter servers as baselines), horovod "
                "(Horovod's allreduce over Gloo; the hosts need it installed)",
                "workers": "workers per host (default 1; workers= in the hosts file wins)",
                "servers": "servers per host (default 1; servers= in the hosts file wins)",
                "port": f"the scheduler's port on the first host (default {DEFAULT_PORT})",
                "timeout": "stop the job after this many seconds (exit code 124)",
                "env": "KEY=VALUE,... set for every process (e.g. P3_SLICE_SIZE=40000)",
                "detach": "return once the job runs instead of following its output",
                "state_dir": f"where this machine keeps the job's state (default {DEFAULT_STATE_DIR})"}


def _launch_options(path, kvstore, workers, servers, port, timeout, env, detach, state_dir) -> dict:
    pairs = [item.partition("=") for item in env.split(",") if item] if env else []
    if any(not sep for _, sep, _ in pairs):
        raise Exit(f"--env {env!r}: give KEY=VALUE pairs separated by commas", code=2)
    return dict(path=path, kvstore=kvstore, workers=int(workers), servers=int(servers), port=int(port),
                timeout=float(timeout) if timeout else None, env={k: v for k, _, v in pairs}, follow=not detach,
                state_dir=state_dir)


@task(help={"command": "the training command each worker runs ({job_dir}: the job's folder on the host)",
            **_LAUNCH_HELP})
def launch(ctx, command, hosts_file="hosts", path=DEFAULT_PATH, kvstore="p3", workers=1, servers=1,
           port=DEFAULT_PORT, timeout=None, env=None, detach=False, state_dir=DEFAULT_STATE_DIR):
    """Run a training command across the hosts: the scheduler on the first, workers and servers on each."""
    hosts, connect = _setup(ctx, hosts_file)
    options = _launch_options(path, kvstore, workers, servers, port, timeout, env, detach, state_dir)
    result = _call(deploy.launch, hosts, connect, shlex.split(command), **options)
    print(f"job {result.job.job_id}: " + ("running" if detach else f"exit code {result.exit_code}"))
    if result.exit_code:
        raise Exit(code=result.exit_code)


@task(help={"dest": "local folder for the results (default bench-<model>)", "model": "resnet50_v1 (default), "
            "vgg19, inceptionv3, sockeye, or tiny-mlp (a smoke test)", "systems": "comma-separated, default "
            "p3,dist_sync,mxnet-p3,horovod", "batch_size": "per worker (default 32)", "warmup": "untimed iterations "
            "(default 3)", "iters": "timed iterations (default 20)", "repeats": "rounds over the systems, each in a "
            "shuffled order (default 3)", "bandwidth": "the hosts' link rate (e.g. 10gbit, the cap of fab bandwidth)"
            ": adds the link to the physical bound", "seed": "seed of the shuffled orders (default 0)",
            "allow_dirty": "run from a git tree with uncommitted changes (recorded in every row)",
            "max_busy": "before each job, wait until this machine's CPUs were at most this busy (percent of all "
            "cores) over a 5-second sample (default 10)", "max_load": "also wait for this machine's 1-minute load "
            "to fall below this (default: not checked)", "load_wait": "seconds to wait for an idle machine, then "
            "refuse (default 600)", "force": "start on a busy machine anyway (recorded in every row)",
            **{k: v for k, v in _LAUNCH_HELP.items() if k not in ("detach", "kvstore")}})
def bench(ctx, hosts_file="hosts", path=DEFAULT_PATH, systems="p3,dist_sync,mxnet-p3,horovod", model="resnet50_v1",
          batch_size=32, warmup=3, iters=20, repeats=3, bandwidth=None, seed=0, dest=None, workers=1, servers=1,
          port=DEFAULT_PORT, timeout=None, env=None, state_dir=DEFAULT_STATE_DIR, allow_dirty=False, max_busy=None,
          max_load=None, load_wait=600, force=False):
    """Compare p3kv, MXNet dist_sync, MXNet's P3 and Horovod training a real model on the hosts (GPU when
    present). Horovod needs horovod.mxnet with Gloo on every host (or leave it out: --systems
    p3,dist_sync,mxnet-p3)."""
    hosts, connect = _setup(ctx, hosts_file)
    options = _launch_options(path, "p3", workers, servers, port, timeout, env, False, state_dir)
    for key in ("kvstore", "follow"):
        options.pop(key)
    folder = dest or f"bench-{model}"
    try:
        result = _call(deploy.compare, hosts, connect, folder, systems=[s for s in systems.split(",") if s],
                       model=model, batch_size=int(batch_size), warmup=int(warmup), iters=int(iters),
                       repeats=int(repeats), bandwidth=bandwidth, seed=int(seed), allow_dirty=allow_dirty,
                       max_busy=None if max_busy is None else float(max_busy),
                       max_load=None if max_load is None else float(max_load), load_wait=float(load_wait),
                       force=force, **options)
    except refused() as e:
        raise Exit(str(e), code=3) from None
    for system, why in result.skipped.items():
        print(f"skipped {system}: {why}")
    with open(os.path.join(result.folder, "cluster.md")) as f:
        print(f.read(), end="")
    print(f"rows in {result.folder}/cluster.csv, figure {result.folder}/cluster.png, logs in {result.folder}/")
    if result.exit_code:
        raise Exit(code=result.exit_code)


@task(help={"dest": "local folder for the results (default transport-<kvstore>-<model>)", "model": "resnet50_v1 "
            "(default), vgg19 or inceptionv3", "warmup": "untimed iterations (default 1)", "iters": "timed "
            "iterations (default 5)", **{k: v for k, v in _LAUNCH_HELP.items() if k != "detach"}})
def transport(ctx, hosts_file="hosts", path=DEFAULT_PATH, kvstore="p3", model="resnet50_v1", warmup=1, iters=5,
              dest=None, workers=1, servers=1, port=DEFAULT_PORT, timeout=None, env=None,
              state_dir=DEFAULT_STATE_DIR):
    """Run the transport benchmark (benchmarks/workloads/bench_worker.py: push and broadcast only) for one kvstore."""
    hosts, connect = _setup(ctx, hosts_file)
    options = _launch_options(path, kvstore, workers, servers, port, timeout, env, False, state_dir)
    folder = dest or f"transport-{kvstore}-{model}"
    result = _call(deploy.bench, hosts, connect, folder, model=model, warmup=int(warmup), iters=int(iters),
                   **options)
    for row in result.rows:
        print(f"{row['mode']} {row['model']} {row['n_workers']}w/{row['n_servers']}s: median "
              f"{row['median_s']:.4f} s/iteration, {row['goodput']:.2f} Gbit/s per worker")
    print(f"logs and results in {result.folder}")
    if result.exit_code:
        raise Exit(code=result.exit_code)


@task(help={"hosts_file": HOSTS_HELP, "rate": "cap every host's egress, e.g. 10gbit, 1gbit, 500mbit",
            "clear": "remove the cap", "show": "only show the current qdiscs (the default with no rate)"})
def bandwidth(ctx, hosts_file="hosts", rate=None, clear=False, show=False):
    """Set, clear or show an egress bandwidth cap (tc tbf) on each host's interface."""
    hosts, connect = _setup(ctx, hosts_file)
    if show and (rate or clear):
        raise Exit("--show only shows: leave out --rate and --clear", code=2)
    for label, text in _call(deploy.bandwidth, hosts, connect, rate=rate, clear=clear).items():
        print(f"{label}: {text}")


@task(help={"hosts_file": HOSTS_HELP, "job": "the job id (default: the latest)",
            "state_dir": _LAUNCH_HELP["state_dir"]})
def status(ctx, hosts_file="hosts", job=None, state_dir=DEFAULT_STATE_DIR):
    """Whether the job runs on each host, its exit code and the last lines of its output."""
    hosts, connect = _setup(ctx, hosts_file)
    state = _job(state_dir, job)
    for label, info in _call(deploy.status, hosts, connect, state).items():
        what = "running" if info["running"] else f"exited with code {info['exit_code']}"
        print(f"[{label}] job {state.job_id}: {what}")
        for line in info["log"].splitlines():
            print(f"[{label}]   {line}")


@task(help={"hosts_file": HOSTS_HELP, "job": "the job id (default: the latest)", "dest": "local folder (default "
            "logs-<job id>)", "state_dir": _LAUNCH_HELP["state_dir"]})
def logs(ctx, hosts_file="hosts", job=None, dest=None, state_dir=DEFAULT_STATE_DIR):
    """Copy the job's logs and results from every host into DEST/<host>/."""
    hosts, connect = _setup(ctx, hosts_file)
    state = _job(state_dir, job)
    folder = dest or f"logs-{state.job_id}"
    for label, paths in _call(deploy.logs, hosts, connect, state, folder).items():
        print(f"{label}: {len(paths)} files")
    print(f"in {folder}")


@task(help={"hosts_file": HOSTS_HELP, "job": "the job id (default: the latest)", "grace": "seconds the launchers "
            "get to stop their processes before they are killed (default 20)", "state_dir": _LAUNCH_HELP["state_dir"]})
def stop(ctx, hosts_file="hosts", job=None, grace=20.0, state_dir=DEFAULT_STATE_DIR):
    """Stop the job on every host (exactly its recorded processes)."""
    hosts, connect = _setup(ctx, hosts_file)
    state = _job(state_dir, job)
    for label, info in _call(deploy.stop, hosts, connect, state, float(grace)).items():
        print(f"{label}: {json.dumps(info)}")
