"""CPU-limited emulated hosts for real (root, cgroups, namespaces): a host's processes and their children are
held to its quota and accounted, the other host's group sees none of it, and the groups go with the cluster,
also when the process that made them was killed."""

import os
import pathlib
import subprocess
import sys
import time

import pytest
from harness import ROOT

from benchmarks.emulation import cpu_limit, emulated_cluster

pytestmark = pytest.mark.system

# Two processes (a parent and the child it forks) burn CPU for `seconds` of wall time; each prints its cpu cgroup.
BURNER = r"""
import os, sys, time
seconds = float(sys.argv[1])
child = os.fork()
def cgroup():
    return next(line.split(":", 2)[2].strip() for line in open("/proc/self/cgroup") if line.split(":")[1] == "cpu")
end = time.monotonic() + seconds
while time.monotonic() < end:
    pass
# One write per line: print's text and newline can reach the shared pipe as two writes, interleaved with the
# other process's.
os.write(1, (("child " if child == 0 else "parent ") + cgroup() + "\n").encode())
if child:
    os.waitpid(child, 0)
"""


def _require():
    reason = emulated_cluster.why_unavailable() or cpu_limit.why_unavailable()
    if reason:
        pytest.skip(reason)


def test_a_host_is_held_to_its_quota_and_accounted_and_its_groups_go_with_the_cluster():
    _require()
    with emulated_cluster.EmulatedCluster(2, "1gbit", cpu_groups=True) as cluster:
        dirs = [d for g in cluster.cpu.groups for d in g.dirs]
        assert all(d.is_dir() for d in dirs)
        cluster.set_cpu_quota(0.2)  # 2 ms of CPU per 10 ms period, for the parent and its child together
        before = cluster.cpu.usage()
        start = time.monotonic()
        done = cluster.run(0, [sys.executable, "-c", BURNER, "1.5"], capture_output=True, text=True, timeout=60,
                           check=True)
        wall = time.monotonic() - start
        used = [a - b for a, b in zip(cluster.cpu.usage(), before)]
        name = cluster.cpu.groups[0].name
        assert sorted(done.stdout.split()) == sorted(["parent", f"/{name}", "child", f"/{name}"]), done.stdout
        # Two busy processes would use 2 x 1.5 s of CPU unlimited; the quota allows 0.2 cores over the wall time,
        # plus the quota of the period under way at each end and the kernel's per-CPU runtime slices handed out
        # ahead (a few ms each).
        assert 0.1 < used[0].cpu_s <= 0.2 * wall + 0.06, (used[0], wall)
        assert used[0].throttled_s > 0.5 and used[0].throttled_periods >= 5, used[0]
        assert used[1].cpu_s < 0.05 and used[1].throttled_periods == 0, used[1]
        # A process still running at teardown is ended with its group.
        sleeper = cluster.popen(1, ["sleep", "600"])
        deadline = time.monotonic() + 10
        while sleeper.pid not in cluster.cpu.groups[1].pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sleeper.pid in cluster.cpu.groups[1].pids()
    assert sleeper.wait(timeout=10) != 0
    assert not any(d.exists() for d in dirs)


def test_groups_of_a_killed_runner_are_removed_by_the_next_cleanup():
    _require()
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); import benchmarks.emulation.emulated_cluster as e; "
            "c = e.EmulatedCluster(2, cpu_groups=True).start(); print(c.name, flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code, ROOT], stdout=subprocess.PIPE, text=True)
    name = child.stdout.readline().strip()
    child.kill()
    child.wait()
    hierarchy = cpu_limit.find_hierarchy()
    left = [d for i in range(2) for d in hierarchy.dirs(f"{name}h{i}")]
    assert left and all(pathlib.Path(d).is_dir() for d in left)
    removed = emulated_cluster.cleanup_stale()
    assert {str(d) for d in left} <= set(removed)
    assert not any(d.exists() for d in left)


def test_a_thread_of_a_limited_host_may_run_real_time_as_the_virtual_gpu_timer_does():
    """With RT group scheduling (cgroup v1 here) a new group has no real-time budget and sched_setscheduler fails
    with EPERM in it: the virtual GPU's timer then completed operations up to ms late under the quota. Each host's
    group gets a budget."""
    _require()
    with emulated_cluster.EmulatedCluster(1, "1gbit", cpu_groups=True) as cluster:
        rt = cluster.cpu.groups[0].dirs[0] / "cpu.rt_runtime_us"
        if not rt.exists():
            pytest.skip("this kernel has no RT group scheduling: real-time threads need no budget per group")
        assert int(rt.read_text()) == cpu_limit.RT_RUNTIME_US
        cluster.set_cpu_quota(0.2)
        probe = "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)); print(os.sched_getscheduler(0))"
        done = cluster.run(0, [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.split() == [str(1)], done.stderr  # SCHED_FIFO is 1


RECEIVER = r"""
import socket, sys
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 5999)); srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
total = 0
while True:
    chunk = conn.recv(1 << 20)
    if not chunk:
        break
    total += len(chunk)
print(total, flush=True)
"""
SENDER = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5999), timeout=30)
block = b"x" * (1 << 20)
for _ in range(int(sys.argv[2])):
    s.sendall(block)
s.close()
"""


def _thread_cpu_s(tid: int) -> float:
    fields = pathlib.Path(f"/proc/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _cpu_cgroup(tid: int) -> str:
    for line in pathlib.Path(f"/proc/{tid}/cgroup").read_text().splitlines():
        if "cpu" in line.split(":")[1].split(","):
            return line.split(":", 2)[2].strip()
    return ""


def test_a_hosts_tcp_receive_work_runs_on_its_own_thread_in_its_own_group():
    """With threaded_rx the hosts receive on NAPI threads (link_napi.py): host 1's receive thread is in host 1's
    CPU group and does the work of a transfer host 0 sends it (without the switch ports' TSO off it would do none:
    this test caught that); the machine's CFS bandwidth slice is 1 ms while the groups exist."""
    _require()
    slice_before = cpu_limit.SLICE_FILE.read_text().strip()
    with emulated_cluster.EmulatedCluster(2, "1gbit", cpu_groups=True) as plain:
        assert plain.link_rx == "softirq" and plain.rx_threads == [[], []]  # the default: the kernel's way
    with emulated_cluster.EmulatedCluster(2, "1gbit", cpu_groups=True, threaded_rx=True) as cluster:
        if cluster.rx_problem:
            pytest.skip(f"this kernel keeps veth receive work in softirq: {cluster.rx_problem}")
        assert cluster.link_rx == "napi-threads"
        assert cpu_limit.SLICE_FILE.read_text().strip() == str(cpu_limit.BANDWIDTH_SLICE_US)
        tids = cluster.rx_threads
        assert all(len(t) == 1 for t in tids), tids
        for i, (tid,) in enumerate(tids):
            assert _cpu_cgroup(tid) == f"/{cluster.cpu.groups[i].name}"
        receiver = cluster.popen(1, [sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
        assert receiver.stdout.readline().strip() == "ready"
        before = _thread_cpu_s(tids[1][0])
        cluster.run(0, [sys.executable, "-c", SENDER, cluster.address(1), "100"], check=True, timeout=60)
        assert receiver.stdout.readline().strip() == str(100 << 20)
        assert receiver.wait(timeout=10) == 0
        assert _thread_cpu_s(tids[1][0]) - before > 0.0, "host 1's receive thread did none of the receive work"
    assert cpu_limit.SLICE_FILE.read_text().strip() == slice_before
