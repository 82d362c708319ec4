"""The Fabric deployment (deploy/) end to end: real sshd on emulated hosts, real SSH, real jobs.

Three hosts are network namespaces of an emulated cluster (benchmarks/emulation/emulated_cluster.py), each running its
own sshd with keys made here. Their addresses exist only inside the namespaces, so the connections' TCP sockets are
opened inside host 0's namespace (as if this test ran on the head node); everything else is the real deploy code
and real SSH. The hosts share this machine's filesystem, so install copies once and the others see that copy.
Needs root (network namespaces, tc); skipped with the reason otherwise.
"""

import ctypes
import io
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time

import fabric
import paramiko
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "scripts"))

import deploy_train  # noqa: E402

from benchmarks.emulation import emulated_cluster  # noqa: E402
from deploy import DeployError, bandwidth, bench, compare, install, launch, logs, parse_hosts, status, stop  # noqa: E402
from deploy.job import KVSTORES  # noqa: E402

pytestmark = [pytest.mark.system,
              pytest.mark.skipif(emulated_cluster.why_unavailable() is not None,
                                 reason=f"emulated hosts: {emulated_cluster.why_unavailable()}")]

SSHD = "/usr/sbin/sshd"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
HOSTS = """
# the three emulated hosts: 2 workers and 2 servers in all, host 2 found its interface from its address
root@10.77.0.1 interface=eth0 workers=1 servers=1
root@10.77.0.2 interface=eth0 workers=1 servers=0 gpus=0
root@10.77.0.3 workers=0 servers=1
"""
TRAIN = ["python", "tests/scripts/deploy_train.py", "--out", "{job_dir}"]


def socket_in_netns(netns: str, address: tuple, timeout: float) -> socket.socket:
    """A TCP connection to `address` made from inside the network namespace `netns` (a thread enters it; the
    rest of the process stays where it is)."""
    box: dict = {}

    def connect() -> None:
        try:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, os.strerror(err))
            finally:
                os.close(fd)
            box["sock"] = socket.create_connection(address, timeout=timeout)
        except OSError as e:
            box["error"] = e

    thread = threading.Thread(target=connect)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["sock"]


class NetnsConnection(fabric.Connection):
    """A Fabric connection whose socket is opened in a network namespace (through Fabric's gateway hook)."""

    def __init__(self, netns: str, *args, **kwargs):
        super().__init__(*args, gateway="netns", **kwargs)
        # Not `self.netns = ...`: a Connection stores attributes it does not know in its Config, which every
        # connection shares, and re-merges that Config, so a thread making another connection meanwhile reads it
        # empty (Fabric: "No attribute or config key found for 'forward_agent'").
        self._set(netns=netns)

    def open_gateway(self):
        return socket_in_netns(self.netns, (self.host, self.port), self.connect_timeout)


def connector(netns: str, key: str, timeout: int = 5):
    """The tests' connection factory: key `key`, no SSH config files, no known_hosts, sockets in `netns`."""
    config = fabric.Config(ssh_config=paramiko.SSHConfig())

    def connect(host):
        return NetnsConnection(netns, host.hostname, user=host.user, port=host.port, config=config,
                               connect_timeout=timeout,
                               connect_kwargs={"key_filename": key, "look_for_keys": False, "allow_agent": False})

    return connect


def test_connections_leave_the_config_they_share_alone():
    """Connections are made in parallel threads from one Config: making one must not write into that Config."""
    [host] = parse_hosts("root@10.77.0.1", "test hosts")
    conn = connector("p3kv-test-none", "/nonexistent-key")(host)
    assert conn.netns == "p3kv-test-none"
    assert "netns" not in conn.config, "the connection wrote its namespace into the shared Config"


class Sshd:
    """sshd in one emulated host, listening on its address only; stderr kept (drained by a thread). Each host has
    its own UTS namespace whose hostname is its address, as real hosts have their own names: Horovod's Gloo finds
    a rank's address from its host's name."""

    def __init__(self, cluster, i: int, folder: str):
        config = os.path.join(folder, f"sshd{i}.conf")
        with open(config, "w") as f:
            f.write(f"""Port 22
ListenAddress {cluster.address(i)}
HostKey {folder}/host_key
AuthorizedKeysFile {folder}/authorized_keys
PidFile none
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
""")
        self.lines: list[str] = []
        self.ready = threading.Event()
        named = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', cluster.address(i)]
        self.proc = cluster.popen(i, [*named, SSHD, "-D", "-e", "-f", config], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())
            if "Server listening on" in line:
                self.ready.set()
        self.ready.set()  # exited: wait() below reports it

    def wait_ready(self, timeout: float = 15) -> None:
        if not self.ready.wait(timeout) or self.proc.poll() is not None:
            raise RuntimeError("sshd did not start: " + "\n".join(self.lines[-10:]))


# For the fab command line: ssh's ProxyCommand, run inside host 0's namespace, relays stdin/stdout to host:port.
RELAY = """import socket, sys, threading
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
sock.settimeout(None)
def up():
    while data := sys.stdin.buffer.raw.read(65536):
        sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := sock.recv(65536):
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
"""


def job_processes(cluster, path: str) -> dict:
    """{namespace: [(pid, name)]} of the processes in the hosts' namespaces that belong to a job of the deployment
    at `path` (its path is on their command line or, as PYTHONPATH and P3_SECRET_FILE, in their environment).
    Other processes there are sshd and what the login shells of its sessions run (e.g. a ~/.bashrc)."""
    found = {}
    needle = path.encode()
    for i in range(cluster.hosts):
        pids = subprocess.run(["ip", "netns", "pids", cluster.netns(i)], capture_output=True, text=True,
                              timeout=10).stdout.split()
        ours = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    text = f.read()
                with open(f"/proc/{pid}/environ", "rb") as f:
                    text += f.read()
                with open(f"/proc/{pid}/comm") as f:
                    name = f.read().strip()
            except OSError:
                continue  # exited meanwhile
            if needle in text:
                ours.append((int(pid), name))
        if ours:
            found[cluster.netns(i)] = ours
    return found


def assert_no_job_left(site) -> None:
    deadline = time.monotonic() + 10  # `tail --pid` following a log ends within 0.2 s of the job
    while job_processes(site["cluster"], site["path"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job_processes(site["cluster"], site["path"]) == {}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The emulated hosts with sshd running, keys, the hosts and a connection factory."""
    if not os.access(SSHD, os.X_OK):
        pytest.fail(f"{SSHD} not found: apt-get install openssh-server (.ci/run does)")
    folder = str(tmp_path_factory.mktemp("deploy"))
    for name in ("host_key", "client_key", "wrong_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(folder, name)],
                       check=True, timeout=30)
    with open(os.path.join(folder, "client_key.pub")) as src, open(os.path.join(folder, "authorized_keys"), "w") as f:
        f.write(src.read())
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    cluster = emulated_cluster.EmulatedCluster(hosts=3)
    cluster.start()
    daemons = []
    try:
        daemons = [Sshd(cluster, i, folder) for i in range(cluster.hosts)]
        for daemon in daemons:
            daemon.wait_ready()
        yield {"cluster": cluster, "folder": folder, "hosts": parse_hosts(HOSTS, "test hosts"),
               "connect": connector(cluster.netns(0), os.path.join(folder, "client_key")),
               "path": os.path.join(folder, "p3kv-deploy"), "state": os.path.join(folder, "state")}
    finally:
        names = [*cluster.namespaces, cluster.bridge_ns]
        cluster.close()
        for daemon in daemons:
            daemon.proc.wait(timeout=10)  # killed with its namespace
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
        assert not any(name in left.split() for name in names), left


@pytest.fixture(scope="module")
def installed(site):
    start = time.monotonic()
    result = install(site["hosts"], site["connect"], path=site["path"], venv=sys.prefix, prebuilt=True, horovod=True)
    return result, time.monotonic() - start


def test_install_copies_once_per_filesystem_and_imports(site, installed):
    result, seconds = installed
    assert list(result) == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    # The hosts share this machine's filesystem: the first copy serves the others.
    assert [r.copied for r in result.values()] == [True, False, False]
    for r in result.values():
        assert r.path == site["path"] and r.python == os.path.join(sys.prefix, "bin", "python")
        assert r.mxnet.startswith("1.") and r.horovod == "0.28.1"
    assert os.path.isfile(os.path.join(site["path"], "p3kv", "launch", "__main__.py"))
    assert os.path.isfile(os.path.join(site["path"], "deploy", "hostctl.py"))
    assert not os.path.exists(os.path.join(site["path"], ".git"))
    assert seconds < 90  # offline: nothing is downloaded or built


def test_training_across_hosts_gives_equal_weights(site, installed):
    out = io.StringIO()
    result = launch(site["hosts"], site["connect"], TRAIN, path=site["path"], state_dir=site["state"], out=out,
                    timeout=90)
    text = out.getvalue()
    assert result.exit_code == 0, text
    assert result.exit_codes == {"10.77.0.1": 0, "10.77.0.2": 0, "10.77.0.3": 0}, text
    assert (result.job.num_workers, result.job.num_servers) == (2, 2)
    # Output streamed with host prefixes; host 1's worker saw the GPUs of the hosts file.
    assert re.search(r"^\[10\.77\.0\.1\] \[worker 0\] rank \d: 5 steps", text, re.M), text
    assert re.search(r"^\[10\.77\.0\.2\] \[worker 0\] rank \d: .*gpus 0$", text, re.M), text

    folder = os.path.join(site["folder"], "logs-train")
    collected = logs(site["hosts"], site["connect"], result.job, folder)
    assert sorted(collected) == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    for label, paths in collected.items():
        names = {os.path.relpath(p, os.path.join(folder, label)) for p in paths}
        assert {"launcher.log", "exit_code", "state.json"} <= names, names
        assert "secret" not in names
    sums = {}
    for label in ("10.77.0.1", "10.77.0.2"):
        [name] = [n for n in os.listdir(os.path.join(folder, label)) if n.startswith("weights")]
        with open(os.path.join(folder, label, name)) as f:
            sums[name] = f.read().strip()
    assert sorted(sums) == ["weights0.txt", "weights1.txt"]
    assert set(sums.values()) == {deploy_train.reference(2)}
    assert status(site["hosts"], site["connect"], result.job)["10.77.0.1"]["exit_code"] == 0
    assert_no_job_left(site)


def test_detached_job_keeps_its_secret_off_command_lines_and_stops_completely(site, installed):
    sleeper = ["python", "-c", "import time; time.sleep(300)"]
    result = launch(site["hosts"], site["connect"], sleeper, path=site["path"], state_dir=site["state"],
                    follow=False, env={"P3_CONNECT_TIMEOUT": "300"})
    job = result.job
    running = status(site["hosts"], site["connect"], job)
    assert all(info["running"] and info["processes"] for info in running.values()), running
    assert len(job_processes(site["cluster"], site["path"])) == 3  # what assert_no_job_left looks for is there
    for part in job.hosts:
        path = os.path.join(part.job_dir, "secret")
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert os.stat(part.job_dir).st_mode & 0o777 == 0o700
        with open(path) as f:
            secret = f.read().strip()
        for pid in [p for info in running.values() for p in info["processes"]]:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read()
            except OSError:
                continue
            assert secret.encode() not in cmdline and secret.encode() not in environ
    stopped = stop(site["hosts"], site["connect"], job, grace=20)
    # Hosts are stopped in parallel: one whose job failed on its own because another host's part was stopped
    # first (e.g. its server lost the scheduler) reports was_running False. Every launcher ended and recorded
    # its exit code, and none had to be killed.
    assert any(s["was_running"] for s in stopped.values()), stopped
    assert all(s["killed"] == [] and s["exit_code"] is not None for s in stopped.values()), stopped
    assert_no_job_left(site)
    assert not any(info["running"] for info in status(site["hosts"], site["connect"], job).values())
    again = stop(site["hosts"], site["connect"], job)
    assert not any(s["was_running"] for s in again.values())


def test_a_failing_host_stops_the_job_everywhere(site, installed):
    fail_on_host1 = ["python", "-c", "import os, sys, time\n"
                     "sys.exit(3) if os.environ['P3_NODE_HOST'] == '10.77.0.2' else time.sleep(300)"]
    out = io.StringIO()
    start = time.monotonic()
    result = launch(site["hosts"], site["connect"], fail_on_host1, path=site["path"], state_dir=site["state"],
                    out=out, grace=10)
    assert result.exit_code == 3, out.getvalue()
    assert result.exit_codes["10.77.0.2"] == 3
    assert time.monotonic() - start < 60
    assert_no_job_left(site)


def test_bandwidth_cap_set_shown_and_cleared(site):
    hosts, connect, cluster = site["hosts"], site["connect"], site["cluster"]
    shown = bandwidth(hosts, connect, rate="10gbit")
    for i in range(cluster.hosts):
        qdisc = cluster.run(i, ["tc", "qdisc", "show", "dev", "eth0"], capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "rate 10Gbit" in qdisc, qdisc
        assert "rate 10Gbit" in shown[cluster.address(i)]
    assert all("rate 10Gbit" in text for text in bandwidth(hosts, connect).values())
    bandwidth(hosts, connect, clear=True)
    for i in range(cluster.hosts):
        qdisc = cluster.run(i, ["tc", "qdisc", "show", "dev", "eth0"], capture_output=True, text=True).stdout
        assert "tbf" not in qdisc, qdisc
    bandwidth(hosts, connect, clear=True)  # nothing to clear: no error


def test_bench_collects_results(site, installed):
    folder = os.path.join(site["folder"], "bench")
    result = bench(site["hosts"], site["connect"], folder, kvstore="p3", warmup=1, iters=1, path=site["path"],
                   state_dir=site["state"], timeout=120, out=io.StringIO())
    assert result.exit_code == 0
    [row] = result.rows
    assert (row["mode"], row["model"], row["n_workers"], row["n_servers"]) == ("p3kv", "resnet50_v1", 2, 2)
    with open(os.path.join(folder, "bench.csv")) as f:
        assert f.readline().startswith("mode,model,")
    assert_no_job_left(site)


def test_compare_runs_every_system_with_real_compute(site, installed):
    """`fab bench`'s comparison: each system trains the model on every host (CPU here: the hosts have no GPU) and
    becomes a row with the emulated runner's columns (bench_rows), iterations, conditions, table and figure, in
    cluster_bench.interleave's order. Horovod runs through the same launcher: its rendezvous on the first host,
    one rank on each host with a worker (hosts 1 and 2), no servers. Speeds are results, never asserted."""
    from benchmarks.analysis import bench_rows
    from benchmarks.suites import cluster_bench

    folder = os.path.join(site["folder"], "compare")
    result = compare(site["hosts"], site["connect"], folder, model="tiny-mlp", batch_size=16, warmup=1, iters=2,
                     repeats=1, bandwidth="1gbit", path=site["path"], state_dir=site["state"], timeout=120,
                     out=io.StringIO(), seed=5, allow_dirty=True, force=True)
    assert result.exit_code == 0, result.rows
    assert sorted(r["kvstore"] for r in result.rows) == ["dist_sync", "horovod", "mxnet-p3", "p3"]
    for row in result.rows:
        assert row["status"] == "ok", row
        servers = 0 if row["kvstore"] == "horovod" else 2
        assert (row["compute"], row["workers"], row["servers"], row["gpu"]) == ("real", 2, servers, "cpu")
        assert row["throughput"] > 0 and row["compute_s"] > 0 and row["bound_s"] >= row["compute_s"]
        assert row["comm_bound_s"] == 0  # hosts 1 and 2 are not one worker + one server: link not in the bound
        assert row["optimizer"].startswith("sgd(")
        assert row["update_on"] == ("workers" if row["kvstore"] in ("mxnet-p3", "horovod") else "servers")
        assert len(row["iter_s"]) == 2 and row["q1_s"] <= row["median_s"] <= row["q3_s"]
        assert [len(times) for times in row["rank_iter_s"]] == [2, 2] and row["iter_s"] == row["rank_iter_s"][0]
        assert (row["allow_dirty"], row["seed"], row["repeats"]) == (True, 5, 1) and row["forced"] in (True, False)
    expected = cluster_bench.interleave([cluster_bench.Point(model="tiny-mlp", kvstore=kv) for kv in KVSTORES], 1, 5)
    assert [(r["kvstore"], r["order"]) for r in result.rows] == [(p.kvstore, p.order) for p in expected]
    with open(os.path.join(folder, "cluster.csv")) as f:
        assert tuple(f.readline().strip().split(",")) == cluster_bench.COLUMNS
        assert len(f.readlines()) == 4
    with open(bench_rows.iterations_path(pathlib.Path(folder, "cluster.csv"))) as f:
        assert len(f.readlines()) == 1 + 4 * 2 * 2  # header; 4 jobs, 2 workers, 2 iterations
    with open(os.path.join(folder, "cluster.md")) as f:
        table = f.read()
    labels = ("p3kv", "dist_sync", "MXNet P3", "Horovod")
    assert all(f"| tiny-mlp | 3 | 1gbit | sgd | {label} |" in table for label in labels), table
    assert os.path.getsize(os.path.join(folder, "cluster.png")) > 0
    assert_no_job_left(site)


def test_compare_with_two_workers_on_a_host_numbers_them_and_pools_every_rank(site, installed):
    """A host running two workers (10.77.0.1) and one running one: every system, Horovod's three ranks and its
    rendezvous included, gives each of the first host's workers its own local rank (the device, and so the GPU
    where there are any, is chosen by it: result files PREFIX.<device>.local<k>.rank<r>.json), and the row pools
    all three ranks' iterations."""
    import statistics

    hosts = parse_hosts("root@10.77.0.1 interface=eth0 workers=2 servers=1\n"
                        "root@10.77.0.2 interface=eth0 workers=1 servers=1", "test hosts")
    folder = os.path.join(site["folder"], "compare-local")
    result = compare(hosts, site["connect"], folder, model="tiny-mlp", batch_size=16, warmup=1, iters=2,
                     repeats=1, path=site["path"], state_dir=site["state"], timeout=120, out=io.StringIO(), seed=1,
                     allow_dirty=True, force=True, env={"MXNET_KVSTORE_BIGARRAY_BOUND": "100000"})
    assert result.exit_code == 0, result.rows
    assert sorted(r["kvstore"] for r in result.rows) == ["dist_sync", "horovod", "mxnet-p3", "p3"]
    for row in result.rows:
        assert row["status"] == "ok" and row["workers"] == 3, row
        ranks = row["rank_iter_s"]
        assert [len(times) for times in ranks] == [2, 2, 2]
        assert row["median_s"] == round(statistics.median(t for times in ranks for t in times), 4)
        expected = "MXNET_KVSTORE_BIGARRAY_BOUND=100000" if row["kvstore"] == "dist_sync" else "default (untuned)"
        assert row["baseline_setting"] == expected
        results = os.listdir(os.path.join(folder, f"0-{row['kvstore']}", "10.77.0.1"))
        assert sorted(n.split(".")[2] for n in results if n.startswith("result.")) == ["local0", "local1"], results
    assert_no_job_left(site)


def test_unreachable_host_and_wrong_key_fail_per_host_quickly(site):
    good = site["hosts"][0]
    [unreachable] = parse_hosts("root@10.77.0.4", "test")
    start = time.monotonic()
    with pytest.raises(DeployError) as error:
        bandwidth([good, unreachable], site["connect"])
    assert time.monotonic() - start < 30
    assert list(error.value.failures) == ["10.77.0.4"]  # the reachable host was fine
    message = str(error.value)
    assert "10.77.0.4: unreachable" in message and "sshd" in message, message

    wrong_key = connector(site["cluster"].netns(0), os.path.join(site["folder"], "wrong_key"))
    start = time.monotonic()
    with pytest.raises(DeployError) as error:
        bandwidth(site["hosts"], wrong_key)
    assert time.monotonic() - start < 30
    assert sorted(error.value.failures) == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    assert "authentication failed" in str(error.value) and "ssh-copy-id" in str(error.value)


def test_missing_interface_venv_and_install_are_named(site):
    [bad_interface] = parse_hosts("root@10.77.0.2 interface=eth9", "test")
    with pytest.raises(DeployError, match=r"10\.77\.0\.2: has no network interface 'eth9'.*eth0.*interface="):
        bandwidth([bad_interface], site["connect"])
    with pytest.raises(DeployError, match=r"10\.77\.0\.1: no p3kv deployment at .*run fab install"):
        launch(site["hosts"][:1], site["connect"], TRAIN, path=os.path.join(site["folder"], "nowhere"),
               state_dir=site["state"])
    with pytest.raises(DeployError, match=r"10\.77\.0\.1: using the virtualenv /nonexistent/venv failed.*no Python"):
        install(site["hosts"][:1], site["connect"], path=os.path.join(site["folder"], "other"),
                venv="/nonexistent/venv", prebuilt=True)
    with pytest.raises(DeployError, match=r"10\.77\.0\.1: creating a virtualenv with /nonexistent/python3 failed "
                       r"\(exit 127\); install Python"):
        install(site["hosts"][:1], site["connect"], path=os.path.join(site["folder"], "other"),
                python="/nonexistent/python3", prebuilt=True)
    with pytest.raises(DeployError, match=r"is not a p3kv deployment"):  # never unpacks over a foreign folder
        install(site["hosts"][:1], site["connect"], path=site["folder"], prebuilt=True)


def test_fab_command_line(site, installed, tmp_path):
    """The fab tasks themselves, with Fabric's -S (SSH config: a ProxyCommand into the namespace) and -i."""
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(f"Host 10.77.0.*\n    ProxyCommand ip netns exec {site['cluster'].netns(0)} "
                          f"{sys.executable} {relay} %h %p\n")
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text(HOSTS)
    fab = [os.path.join(os.path.dirname(sys.executable), "fab"), "-r", os.path.join(ROOT, "deploy"),
           "-S", str(ssh_config), "-i", os.path.join(site["folder"], "client_key")]

    def run(*args):
        return subprocess.run([*fab, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)

    done = run("bandwidth", "--hosts-file", str(hosts_file), "--show")
    assert done.returncode == 0, done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    state = str(tmp_path / "state")
    done = run("launch", "--hosts-file", str(hosts_file), "--path", site["path"], "--state-dir", state,
               "--timeout", "90", "--command", " ".join(TRAIN))
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^\[10\.77\.0\.2\] \[worker 0\] rank \d: 5 steps", done.stdout, re.M), done.stdout
    done = run("status", "--hosts-file", str(hosts_file), "--state-dir", state)
    assert done.returncode == 0 and done.stdout.count("exited with code 0") == 3, done.stdout + done.stderr
    done = run("bench", "--hosts-file", str(hosts_file), "--path", site["path"], "--state-dir", state,
               "--systems", "p3", "--model", "tiny-mlp", "--warmup", "1", "--iters", "1", "--repeats", "1",
               "--timeout", "90", "--dest", str(tmp_path / "bench"), "--allow-dirty", "--force")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| tiny-mlp | 3 | unknown | sgd | p3kv |" in done.stdout, done.stdout
    assert (tmp_path / "bench" / "cluster.png").exists()
    done = run("stop", "--hosts-file", str(hosts_file), "--state-dir", str(tmp_path / "no-state"))
    assert done.returncode == 2 and "launch one first" in done.stderr, done.stderr
    assert_no_job_left(site)
