"""`fab launch`, `status`, `logs`, `stop`, `bench`: one p3kv job across the hosts, run by one launcher per host.

The first host runs the scheduler; every host runs its share of the workers and servers with
``python -m p3kv.launch ... --local-workers K --local-servers K`` (the launcher's multi-host mode), started through
deploy/hostctl.py so it outlives the SSH connection. Each job has a folder PATH/jobs/<job id>/<host> on every host
(one per host, so hosts sharing a filesystem keep their files apart) holding the shared secret (mode 600, handed
to the launcher as P3_SECRET_FILE, never on a command line), the launcher's output (launcher.log), each process's
log (processes/), the pids (state.json) and the exit code. This machine keeps the job's description in the state
folder (default ~/.p3kv-deploy/<job id>.json; `latest` names the newest), so `status`, `logs` and `stop` find it again.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import queue
import secrets
import shlex
import stat
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

import paramiko

from deploy.hosts import Host
from deploy.install import DEFAULT_PATH, deployed_python
from deploy.network import address_and_interface
from deploy.remote import ConnectionFactory, DeployError, HostError, Session, remote_command
from deploy.state import DEFAULT_STATE_DIR, HostJob, JobState

LOG = logging.getLogger("p3kv.deploy")
DEFAULT_PORT = 9000
KVSTORES = ("p3", "dist_sync", "mxnet-p3", "horovod")
JOB_DIR_PLACEHOLDER = "{job_dir}"  # in a training command: the job's folder on each host
_NOT_COLLECTED = {"secret"}


@dataclasses.dataclass(frozen=True)
class JobResult:
    """How a job ended: `exit_code` 0 when every host's launcher exited 0, else the first failure's code."""

    job: JobState
    exit_code: int
    exit_codes: Mapping[str, int | None]  # per host; None: its launcher left no exit code (killed)


def _hosts_of(job: JobState, hosts: Sequence[Host]) -> list[tuple[Host, HostJob]]:
    by_label = {h.label: h for h in hosts}
    missing = [part.label for part in job.hosts if part.label not in by_label]
    if missing:
        raise ValueError(f"job {job.job_id} ran on {', '.join(missing)}, which the hosts file no longer lists; "
                         "use the hosts file the job was launched with")
    return [(by_label[part.label], part) for part in job.hosts]


def _shares(hosts: Sequence[Host], workers: int, servers: int, kvstore: str = "p3") -> list[tuple[Host, int, int]]:
    """(host, workers, servers) of every host that runs something; the first host always runs the scheduler.
    Horovod has no servers: its hosts are those with workers, the first of them runs the rendezvous."""
    shares = [(h, workers if h.workers is None else h.workers, servers if h.servers is None else h.servers)
              for h in hosts]
    if kvstore == "horovod":
        shares = [(h, w, 0) for h, w, _ in shares if w]
        if not shares:
            raise ValueError("the job needs at least one worker: check workers= in the hosts file and --workers")
        return shares
    shares = [s for i, s in enumerate(shares) if i == 0 or s[1] or s[2]]
    if not sum(s[1] for s in shares) or not sum(s[2] for s in shares):
        raise ValueError("the job needs at least one worker and one server: check workers=/servers= in the hosts "
                         "file and --workers/--servers")
    return shares


class _Prefixed:
    """A text stream that writes whole lines to `out`, each prefixed with `prefix` (one writer per host)."""

    def __init__(self, prefix: str, out: TextIO, lock: threading.Lock):
        self.prefix, self.out, self.lock, self.pending = prefix, out, lock, ""

    def write(self, text: str) -> None:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        if lines:
            with self.lock:
                self.out.write("".join(f"{self.prefix}{line}\n" for line in lines))
                self.out.flush()

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.pending:
            self.write("\n")


def _folder(host: Host) -> str:
    return host.label.replace(":", "_")


def _hostctl(part_dir: str, action: str, *args: str) -> list[str]:
    """argv of deploy/hostctl.py (run in the deployment folder) for the job folder `part_dir`."""
    return ["deploy/hostctl.py", action, "--job-dir", part_dir, *args]


def _start(session: Session, host: Host, target: str, python: str, job_dir: str, secret: str, argv: list[str],
           env: Mapping[str, str]) -> int:
    """Creates the job folder with its secret and starts the host's launcher; the monitor's pid."""
    session.run(host, f"umask 077 && mkdir -p {shlex.quote(job_dir)}", f"creating the job folder {job_dir}")
    session.write_file(host, f"{job_dir}/secret", secret + "\n", mode=0o600)
    venv_bin = os.path.dirname(python)
    # The venv's bin first on PATH, as if activated, so the command's own `python` is the deployment's.
    line = f"export PATH={shlex.quote(venv_bin)}:\"$PATH\" && " + remote_command(
        [python, *_hostctl(job_dir, "start", "--", *argv)], env=env, cwd=target)
    out = session.run(host, line, "starting the launcher", f"see {job_dir}/monitor.log on the host")
    return int(json.loads(out.strip().splitlines()[-1])["monitor_pid"])


def _stop_parts(session: Session, parts: Sequence[tuple[Host, HostJob]], grace: float) -> dict[str, dict]:
    def stop_one(pair: tuple[Host, HostJob]) -> dict:
        host, part = pair
        python = deployed_python(session, host, part.path)
        out = session.run(host, remote_command([python, *_hostctl(part.job_dir, "stop", "--grace", str(grace))],
                                               cwd=part.path), "stopping the job")
        return json.loads(out.strip().splitlines()[-1])

    by_label = {host.label: (host, part) for host, part in parts}
    results = session.each(lambda h: stop_one(by_label[h.label]), "stop", [host for host, _ in parts])
    for label, result in results.items():
        if result.get("killed"):
            LOG.warning("%s: killed %s after the grace period", label, result["killed"])
    return results


def _follow(session: Session, parts: Sequence[tuple[Host, HostJob]], out: TextIO, grace: float,
            timeout: float | None) -> tuple[int, dict[str, int | None]]:
    """Streams every host's launcher output (prefixed with the host) until all end; stops the rest as soon as one
    fails, and on Ctrl-C. (exit code of the job, {label: exit code}); a host whose end was not seen (lost
    connection, or still running `grace` + 30 s after the job was stopped or past its `timeout`) counts as None."""
    lock = threading.Lock()
    ended: queue.SimpleQueue = queue.SimpleQueue()

    def tail(host: Host, part: HostJob) -> None:
        writer = _Prefixed(f"[{host.label}] ", out, lock)
        log = shlex.quote(f"{part.job_dir}/launcher.log")
        code: int | None = None
        try:
            # tail follows the log until the monitor exits (its pid), which is after the exit code is written.
            session.connection(host).run(f"tail -n +1 -s 0.2 --pid={part.monitor_pid} -F {log} 2>/dev/null",
                                         out_stream=writer, hide="stderr", warn=True, in_stream=False)
            writer.close()
            text = session.read_file(host, f"{part.job_dir}/exit_code")
            code = int(text) if text and text.strip() else None
        except (HostError, paramiko.SSHException, OSError, EOFError) as e:
            LOG.error("%s: lost the connection while following the job (%s)", host.label, e)
        ended.put((host.label, code))

    for pair in parts:
        threading.Thread(target=tail, args=pair, name=f"follow {pair[0].label}", daemon=True).start()
    codes: dict[str, int | None] = {}
    failed: tuple[str, int] | None = None
    deadline = None if timeout is None else time.monotonic() + timeout + grace + 30

    def stop_running(why: str) -> None:
        nonlocal deadline
        running = [(h, p) for h, p in parts if h.label not in codes]
        LOG.error("%s; stopping the job on %s", why, ", ".join(h.label for h, _ in running) or "no other host")
        deadline = time.monotonic() + grace + 30
        try:
            _stop_parts(session, running, grace)
        except DeployError as e:
            LOG.error("%s", e)

    try:
        while len(codes) < len(parts):
            try:
                label, code = ended.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                missing = [h.label for h, _ in parts if h.label not in codes]
                LOG.error("no end seen from %s in time; see fab status", ", ".join(missing))
                codes.update({label: None for label in missing})
                failed = failed or (missing[0], 1)
                break
            codes[label] = code
            if code != 0 and failed is None:
                failed = (label, 1 if code is None else code)
                stop_running(f"{label}: the launcher " + ("left no exit code (killed?)" if code is None
                                                          else f"exited with code {code}"))
    except KeyboardInterrupt:
        stop_running("interrupted")
        raise
    return (failed[1] if failed else 0), codes


def launch(hosts: Sequence[Host], connect: ConnectionFactory, command: Sequence[str], *, path: str = DEFAULT_PATH,
           kvstore: str = "p3", workers: int = 1, servers: int = 1, port: int = DEFAULT_PORT,
           env: Mapping[str, str] | None = None, timeout: float | None = None, follow: bool = True,
           state_dir: str = DEFAULT_STATE_DIR, out: TextIO | None = None, grace: float = 20.0) -> JobResult:
    """Runs `command` as every worker of one job across `hosts` (installed at `path`): `workers` and `servers`
    per host unless the hosts file says otherwise. "{job_dir}" in the command is the job's folder on each host
    and `python` is the deployment's. With `follow`, streams the output (to `out`, default stdout) with host
    prefixes until the job ends, stopping every host as soon as one fails; else returns once it runs (exit code
    0). `timeout` (seconds) bounds the job (exit code 124). Raises DeployError naming the hosts where it could not
    start (after stopping it on the others)."""
    if kvstore not in KVSTORES:
        raise ValueError(f"--kvstore {kvstore!r}: use one of {', '.join(KVSTORES)}")
    if not command:
        raise ValueError("give the training command, e.g. --command 'python train.py --kvstore p3'")
    shares = _shares(hosts, workers, servers, kvstore)
    total_workers, total_servers = sum(s[1] for s in shares), sum(s[2] for s in shares)
    job_id = time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
    secret = secrets.token_hex(32)
    used = [s[0] for s in shares]
    with Session(used, connect) as session:
        def prepare(host: Host) -> tuple[str, str, str]:
            target = session.resolve(host, path)
            return target, deployed_python(session, host, target), address_and_interface(session, host)[0]

        found = session.each(prepare, "preparing the launch")
        root = found[used[0].label][2]
        # Horovod's slot plan: every host's address and worker count, in rank order, the same on every host.
        slots = ",".join(f"{found[h.label][2]}:{w}" for h, w, _ in shares)
        started: dict[str, HostJob] = {}

        share_of = {share[0].label: share for share in shares}

        def start(host: Host) -> HostJob:
            _, local_workers, local_servers = share_of[host.label]
            target, python, address = found[host.label]
            # One folder per host, so that hosts sharing a filesystem keep their files apart.
            job_dir = f"{target}/jobs/{job_id}/{_folder(host)}"
            argv = [python, "-m", "p3kv.launch", "-n", str(total_workers), "-s", str(total_servers),
                    "--kvstore", kvstore, "--host", address, "--port", str(port),
                    "--local-workers", str(local_workers), "--local-servers", str(local_servers),
                    "--log-dir", f"{job_dir}/processes"]
            if host.label != used[0].label:
                argv += ["--no-scheduler", "--root", root]
            if kvstore == "horovod":
                argv += ["--slots", slots]
            if timeout is not None:
                argv += ["--timeout", str(timeout)]
            for key, value in (env or {}).items():
                argv += ["--env", f"{key}={value}"]
            argv += ["--", *(word.replace(JOB_DIR_PLACEHOLDER, job_dir) for word in command)]
            host_env = {"PYTHONPATH": target, "P3_SECRET_FILE": f"{job_dir}/secret"}
            if host.gpus:
                host_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, host.gpus))
            pid = _start(session, host, target, python, job_dir, secret, argv, host_env)
            part = HostJob(host.label, target, job_dir, local_workers, local_servers, address, pid)
            started[host.label] = part
            return part

        try:
            parts = session.each(start, "starting the job")
        except DeployError:
            begun = [(h, started[h.label]) for h in used if h.label in started]
            if begun:
                LOG.error("stopping the job on the hosts where it started: %s", ", ".join(started))
                _stop_parts(session, begun, grace)
            raise
        job = JobState(job_id, kvstore, tuple(command), total_workers, total_servers, port,
                       tuple(parts[h.label] for h in used))
        LOG.info("job %s: %d workers, %d servers on %d hosts; state in %s", job_id, total_workers, total_servers,
                 len(used), job.save(state_dir))
        if not follow:
            return JobResult(job, 0, {})
        code, codes = _follow(session, [(h, parts[h.label]) for h in used], sys.stdout if out is None else out,
                              grace, timeout)
    return JobResult(job, code, codes)


def status(hosts: Sequence[Host], connect: ConnectionFactory, job: JobState, lines: int = 5) -> dict[str, dict]:
    """{label: {"running", "exit_code", "processes" (pids of the job there), "log" (its last `lines` lines)}}."""
    pairs = _hosts_of(job, hosts)
    parts = {host.label: part for host, part in pairs}
    with Session([h for h, _ in pairs], connect) as session:
        def one(host: Host) -> dict:
            part = parts[host.label]
            python = deployed_python(session, host, part.path)
            result = json.loads(session.run(host, remote_command([python, *_hostctl(part.job_dir, "status")],
                                                                 cwd=part.path), "reading the job's state"))
            log = shlex.quote(f"{part.job_dir}/launcher.log")
            result["log"] = session.run(host, f"tail -n {int(lines)} {log}", "reading the launcher's log")
            return result

        return session.each(one, "status")


def stop(hosts: Sequence[Host], connect: ConnectionFactory, job: JobState, grace: float = 20.0) -> dict[str, dict]:
    """Stops the job on every host: SIGTERM to each launcher (it stops its processes), SIGKILL to the job's
    recorded processes still there after `grace` seconds. {label: {"was_running", "killed", "exit_code"}}."""
    pairs = _hosts_of(job, hosts)
    with Session([h for h, _ in pairs], connect) as session:
        return _stop_parts(session, pairs, grace)


def logs(hosts: Sequence[Host], connect: ConnectionFactory, job: JobState, dest: str) -> dict[str, list[str]]:
    """Copies every file of the job's folder on each host (logs, results, benchmark output; not the secret) to
    dest/<host>/; {label: local paths}."""
    pairs = _hosts_of(job, hosts)
    parts = {host.label: part for host, part in pairs}
    with Session([h for h, _ in pairs], connect) as session:
        def fetch(host: Host) -> list[str]:
            sftp = session.connection(host).sftp()
            local_root = os.path.join(dest, _folder(host))
            copied = []
            todo = [""]
            while todo:
                rel = todo.pop()
                remote_dir = f"{parts[host.label].job_dir}/{rel}".rstrip("/")
                for entry in sftp.listdir_attr(remote_dir):
                    name = f"{rel}/{entry.filename}".lstrip("/")
                    if stat.S_ISDIR(entry.st_mode or 0):
                        todo.append(name)
                    elif stat.S_ISREG(entry.st_mode or 0) and name not in _NOT_COLLECTED:
                        local = os.path.join(local_root, *name.split("/"))
                        os.makedirs(os.path.dirname(local), exist_ok=True)
                        sftp.get(f"{remote_dir}/{entry.filename}", local)
                        copied.append(local)
            return sorted(copied)

        return session.each(fetch, "collecting logs")


@dataclasses.dataclass(frozen=True)
class BenchResult:
    exit_code: int
    rows: list[dict]  # bench_worker.py's JSON lines (one per run, from worker 0)
    folder: str  # where logs and results were collected; bench.csv there sums them up


def bench(hosts: Sequence[Host], connect: ConnectionFactory, dest: str, *, kvstore: str = "p3",
          model: str = "resnet50_v1", warmup: int = 1, iters: int = 5, **launch_options) -> BenchResult:
    """Runs benchmarks/workloads/bench_worker.py (push and broadcast every array of `model`) as the job's workers,
    collects the logs and results into `dest` and writes dest/bench.csv. `launch_options` go to `launch`."""
    if kvstore == "horovod":
        raise ValueError("the transport benchmark pushes to parameter servers; Horovod has none: compare it with "
                         "`fab bench` (deploy.compare), which trains the model with every system")
    command = ["python", "-m", "benchmarks.workloads.bench_worker", "--model", model, "--warmup", str(warmup),
               "--iters", str(iters), "--out", f"{JOB_DIR_PLACEHOLDER}/bench.jsonl"]
    result = launch(hosts, connect, command, kvstore=kvstore, **launch_options)
    collected = logs(hosts, connect, result.job, dest)
    rows = []
    for path in sorted(p for paths in collected.values() for p in paths if p.endswith("bench.jsonl")):
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    if rows:
        columns = [k for k, v in rows[0].items() if not isinstance(v, (dict, list))]
        with open(os.path.join(dest, "bench.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    return BenchResult(result.exit_code, rows, dest)
