"""Per-thread CPU caps (benchmarks/emulation/thread_cap.py): each thread of an emulated host in a group of its own
at one dilated CPU. Unit tests on a fake cgroup tree; the system test holds a real thread to its cap, where the host's
quota alone lets it run four times faster."""

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from benchmarks.analysis import bench_rows
from benchmarks.emulation import cpu_limit, emulated_cluster, thread_cap
from benchmarks.suites import cluster_bench, sweeps
from benchmarks.suites.cluster_job import Point


def _host(tmp_path, name="p3c1x0h0", tasks=""):
    host = tmp_path / "cpu" / "p3c1x0" / name
    host.mkdir(parents=True)
    (host / "tasks").write_text(tasks)
    (host / "cpu.cfs_quota_us").write_text("-1")
    return host


def _process(proc, pid, group, threads):
    """A fake /proc entry: process `pid` whose main thread is in cpu group `group`, threads {tid: name}."""
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cgroup").write_text(f"12:memory:/\n4:cpu,cpuacct:{group}\n")
    for tid, name in threads.items():
        (proc / str(pid) / "task" / str(tid)).mkdir(parents=True, exist_ok=True)
        (proc / str(tid)).mkdir(exist_ok=True)  # /proc/<tid>: the thread's own view
        (proc / str(tid) / "status").write_text(f"Name:\t{name}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\n")


@pytest.mark.unit
def test_a_threads_quota_is_one_dilated_cpu_per_period():
    assert thread_cap.thread_quota_us(0.11, 9091) == 1000
    assert thread_cap.thread_quota_us(0.25, 10_000) == 2500
    assert thread_cap.thread_quota_us(0.01, 10_000) == 1000  # the kernel's minimum, never less
    with pytest.raises(ValueError, match="must be positive"):
        thread_cap.thread_quota_us(0, 10_000)


@pytest.mark.unit
def test_a_hierarchy_without_v1_tasks_is_refused_naming_the_option(tmp_path):
    v2 = tmp_path / "p3c1x0h0"
    v2.mkdir()
    (v2 / "cpu.max").write_text("max 100000")
    with pytest.raises(cpu_limit.CpuLimitError, match="cgroup v1.*--no-thread-cap"):
        thread_cap.ThreadCaps([v2], 0.1, 10_000)


@pytest.mark.unit
def test_each_thread_gets_a_group_of_its_own_and_exited_ones_are_retired(tmp_path):
    proc, host = tmp_path / "proc", _host(tmp_path, tasks="10\n11\n")
    _process(proc, 10, "/p3c1x0/p3c1x0h0", {10: "python", 11: "python"})
    _process(proc, 1, "/", {1: "init"})  # not a host's: never touched
    caps = thread_cap.ThreadCaps([host], 0.1, 10_000, exempt=[11], proc=proc, rmdir=shutil.rmtree)
    caps.scan()
    child = host / "t10"
    assert (child / "tasks").read_text() == "10"
    assert (child / "cpu.cfs_period_us").read_text() == "10000"
    assert (child / "cpu.cfs_quota_us").read_text() == "1000"
    assert not (host / "t11").exists() and not (host / "t1").exists()  # exempt: a link's receive thread
    (host / "tasks").write_text("11")  # the kernel's part of the move
    # A thread process 10 creates starts in its creator's group: the full pass (not the quick one, which reads the
    # host's own group) finds it in the process's task list and moves it out.
    _process(proc, 10, "/p3c1x0/p3c1x0h0/t10", {12: "python"})
    caps.scan(full=False)
    assert not (host / "t12").exists()
    caps.scan()
    assert (host / "t12" / "tasks").read_text() == "12"
    # A process forked by a capped thread starts in that thread's group: found through /proc.
    _process(proc, 30, "/p3c1x0/p3c1x0h0/t12", {30: "python", 31: "python"})
    caps.scan()
    assert (host / "t30").is_dir() and (host / "t31").is_dir()
    assert caps.hosts[0].placed == 4
    # Thread 12 exits: its group is removed and the time the kernel held it back is counted, once.
    shutil.rmtree(proc / "10" / "task" / "12")
    (host / "t12" / "cpu.stat").write_text("nr_periods 40\nnr_throttled 30\nthrottled_time 250000000\n")
    caps.scan()
    caps.scan()
    assert not (host / "t12").exists()
    assert caps.hosts[0].throttled_s == pytest.approx(0.25)
    # Process 30 exits: both its threads' groups go.
    shutil.rmtree(proc / "30")
    caps.scan()
    assert not (host / "t30").exists() and not (host / "t31").exists()


@pytest.mark.unit
def test_threads_born_gpu_side_keep_their_hosts_quota(tmp_path):
    proc, host = tmp_path / "proc", _host(tmp_path, tasks="40\n")
    _process(proc, 40, "/p3c1x0/p3c1x0h0", {40: "python", 41: thread_cap.GPU_SIDE})
    caps = thread_cap.ThreadCaps([host], 0.1, 10_000, proc=proc, rmdir=shutil.rmtree)
    caps.scan()
    caps.scan()
    assert (host / "t40").is_dir() and not (host / "t41").exists()
    assert (host / "tasks").read_text() == "41"  # moved out of its creator's group into its host's
    assert caps.hosts[0].placed == 1 and caps.hosts[0].gpu_side == 1
    # gpu_side() names the threads the caller creates, then gives the caller its name back.
    (proc / "thread-self").mkdir()
    (proc / "thread-self" / "comm").write_text("python\n")
    with thread_cap.gpu_side(proc):
        assert (proc / "thread-self" / "comm").read_text() == thread_cap.GPU_SIDE
    assert (proc / "thread-self" / "comm").read_text() == "python"


@pytest.mark.unit
def test_the_threads_torch_names_for_its_gloo_process_group_keep_their_hosts_quota(tmp_path):
    # DDP's Gloo threads sum and send what NCCL does on a GPU host; torch renames them as they start (seen on torch
    # 2.13: pt_gloo_runloop, gloo_tcp_loop), so they are known by name. Its store's thread is capped like the rest.
    proc, host = tmp_path / "proc", _host(tmp_path, tasks="50\n")
    _process(proc, 50, "/p3c1x0/p3c1x0h0", {50: "python", 51: "pt_gloo_runloop", 52: "gloo_tcp_loop",
                                            53: "pt_tcpstore_uv"})
    caps = thread_cap.ThreadCaps([host], 0.1, 10_000, proc=proc, rmdir=shutil.rmtree)
    caps.scan()
    caps.scan()
    assert caps.hosts[0].gpu_side == 2 and caps.hosts[0].placed == 2
    assert not (host / "t51").exists() and not (host / "t52").exists() and (host / "t53").is_dir()


@pytest.mark.unit
def test_a_thread_its_group_cannot_take_stays_with_its_host_and_is_counted_once(tmp_path):
    proc, host = tmp_path / "proc", _host(tmp_path, tasks="13\n")
    _process(proc, 13, "/p3c1x0/p3c1x0h0", {13: "vgpu"})
    (host / "t13").write_text("")  # in the way of the child group: mkdir fails (as a real-time thread's move does)
    caps = thread_cap.ThreadCaps([host], 0.1, 10_000, proc=proc, rmdir=shutil.rmtree)
    caps.scan()
    caps.scan()
    assert caps.hosts[0].placed == 0 and caps.hosts[0].refused == 1
    assert caps.hosts[0].refusals == {"EEXIST": 1}


@pytest.mark.unit
def test_stop_moves_threads_back_to_their_host_and_removes_every_child(tmp_path):
    proc, host = tmp_path / "proc", _host(tmp_path, tasks="20\n")
    _process(proc, 20, "/p3c1x0/p3c1x0h0", {20: "python"})
    caps = thread_cap.ThreadCaps([host], 0.1, 10_000, interval_s=0.01, proc=proc, rmdir=shutil.rmtree).start()
    time.sleep(0.05)
    hosts = caps.stop()
    assert hosts[0].placed == 1
    assert (host / "tasks").read_text() == "20"
    assert not any(d.is_dir() for d in host.iterdir())


@pytest.mark.unit
def test_caps_begin_when_the_run_says_start_up_is_over_and_gpu_side_threads_are_never_capped(tmp_path):
    proc, host = tmp_path / "proc", _host(tmp_path, tasks="50\n51\n52\n")
    _process(proc, 50, "/p3c1x0/p3c1x0h0", {50: "python", 51: "python", 52: thread_cap.GPU_SIDE})
    ready = []
    caps = thread_cap.ThreadCaps([host], 0.1, 10_000, proc=proc, rmdir=shutil.rmtree, ready=lambda: bool(ready))
    caps.scan()
    caps.scan(full=False)
    assert caps.began_at is None and not any(d.is_dir() for d in host.iterdir())  # start-up: the host's quota
    assert caps.hosts[0].gpu_side == 1 and caps.hosts[0].placed == 0
    _process(proc, 50, "/p3c1x0/p3c1x0h0", {53: "python"})  # born during start-up, in the host's group
    (host / "tasks").write_text("50\n51\n52\n53\n")
    caps.scan()
    assert not (host / "t53").exists()
    before = time.time()
    ready.append(True)  # every worker has built its model
    caps.scan(full=False)  # the quick pass is enough: the first one after start-up looks at everything
    assert caps.began_at is not None and caps.began_at >= before
    assert sorted(d.name for d in host.iterdir() if d.is_dir()) == ["t50", "t51", "t53"]
    assert caps.hosts[0].placed == 3 and caps.hosts[0].gpu_side == 1
    # Without `ready` the caps begin at the first scan.
    assert thread_cap.ThreadCaps([_host(tmp_path, "p3c1x0h1")], 0.1, 10_000, proc=proc).began_at is None
    now = thread_cap.ThreadCaps([_host(tmp_path, "p3c1x0h2")], 0.1, 10_000, proc=proc)
    now.scan(full=False)
    assert now.began_at is not None


@pytest.mark.unit
def test_workers_say_they_are_ready_in_the_folder_the_runner_names(tmp_path, monkeypatch):
    from benchmarks.workloads import worker_output
    folder = str(tmp_path / "run.r0.ready")
    monkeypatch.delenv(worker_output.READY_ENV, raising=False)
    worker_output.mark_ready()  # no runner asked (fab bench, a worker run by hand): nothing written
    assert worker_output.ready_count(folder) == 0 and list(tmp_path.iterdir()) == []
    monkeypatch.setenv(worker_output.READY_ENV, folder)
    worker_output.mark_ready()
    worker_output.mark_ready()  # the same process twice counts once
    assert worker_output.ready_count(folder) == 1
    assert (tmp_path / "run.r0.ready" / str(os.getpid())).exists()


@pytest.mark.unit
def test_a_point_caps_threads_only_with_cpu_limits_and_keys_apart():
    base = dict(model="resnet50_v1", kvstore="p3", gpu_scale=0.11, host_cpus=4.0)
    assert Point(**base, thread_cap=True).thread_cap_cores == 0.11
    assert Point(**base).thread_cap_cores is None
    assert Point(**{**base, "host_cpus": None}, thread_cap=True).thread_cap_cores is None
    for flags, cores in (([], 0.11), (["--thread-cap"], 0.11), (["--no-thread-cap"], None),
                         (["--no-cpu-limit"], None)):  # on by default, and only with CPU limits
        args = cluster_bench.parse_args(["--model", "resnet50_v1", "--kvstore", "p3", "--gpu-scale", "0.11", *flags])
        assert all(p.thread_cap_cores == cores for p in cluster_bench.points_from_args(args)), flags
    from benchmarks.suites import sweeps
    capped, free = (sweeps._signature(sweeps._settings(Point(**base, thread_cap=c))) for c in (True, False))
    assert capped != free  # --resume never takes a capped run for an uncapped one


@pytest.mark.unit
def test_capped_hosts_give_each_process_their_cpu_count_of_openmp_threads():
    from benchmarks.analysis import points
    from benchmarks.suites import cluster_job
    assert thread_cap.omp_threads(8.0, 0.05) == 8 and thread_cap.omp_threads(4.4, 0.1) == 4
    assert thread_cap.omp_threads(4.0, None) == 1 and thread_cap.omp_threads(None, None) == 1  # uncapped: one
    base = dict(model="vgg19", kvstore="dist_sync", hosts=2, bandwidth="1gbit", gpu_scale=0.05, host_cpus=8.0)
    capped = cluster_job._environment(Point(**base, thread_cap=True), {})
    free = cluster_job._environment(Point(**base), {})
    assert (capped["OMP_NUM_THREADS"], free["OMP_NUM_THREADS"]) == ("8", "1")
    assert capped["MXNET_CPU_WORKER_NTHREADS"] == "1"  # MXNet's own default: one engine thread, OpenMP inside ops
    # Rows from before the column ran one thread: they key as one, apart from a host's count.
    assert points.key_value({}, "omp_threads") == points.key_value({"omp_threads": "1"}, "omp_threads") == "1"
    assert points.key_value({"omp_threads": "8"}, "omp_threads") == "8" and "omp_threads" in points.POINT_KEY
    # --resume: a capped row from before the rule ran one thread, so it is not the run a capped point now makes.
    point = Point(**base, thread_cap=True)
    planned = sweeps._signature(sweeps._settings(point))
    row = {k: ("" if v is None else str(v)) for k, v in sweeps._settings(point).items()}
    assert sweeps._signature(row) == planned  # the row the point writes counts as done
    assert sweeps._signature({**row, "omp_threads": ""}) != planned  # one from before the rule does not
    free = dataclasses.replace(point, thread_cap=False)
    assert sweeps._signature({**row, "thread_cap_cores": "", "omp_threads": ""}) == sweeps._signature(
        sweeps._settings(free))  # uncapped rows ran one thread before and after the column


def _skip_without_thread_caps() -> None:
    """Skips (saying why) where namespaces, CPU groups or cgroup v1 are missing: the system tests need all three."""
    reason = emulated_cluster.why_unavailable() or cpu_limit.why_unavailable()
    if reason:
        pytest.skip(reason)
    if cpu_limit.find_hierarchy().version != 1:
        pytest.skip("per-thread caps need cgroup v1; this machine has v2")


# One thread burns CPU for argv[1] seconds of wall time while the main thread waits; it reports its CPU time and
# its cpu cgroup.
BURNER = r"""
import json, sys, threading, time
seconds, out = float(sys.argv[1]), {}
def burn():
    open("/proc/thread-self/comm", "w").write("burner")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    out["cpu_s"] = time.thread_time()
    out["tid"] = threading.get_native_id()
    out["cgroup"] = next(line.split(":", 2)[2].strip() for line in open("/proc/thread-self/cgroup")
                         if line.split(":")[1] == "cpu")
t = threading.Thread(target=burn)
t.start()
t.join()
print(json.dumps(out))
"""


@pytest.mark.system
def test_a_busy_thread_runs_at_one_dilated_cpu_not_at_its_hosts_whole_quota():
    _skip_without_thread_caps()
    seconds, cores = 2.0, 0.1
    with emulated_cluster.EmulatedCluster(1, None, cpu_groups=True) as cluster:
        cluster.set_cpu_quota(4 * cores)  # a host of 4 CPUs at gpu_scale 0.1

        def burn() -> dict:
            done = cluster.run(0, [sys.executable, "-c", BURNER, str(seconds)], capture_output=True, text=True,
                               timeout=60, check=True)
            return json.loads(done.stdout)

        free = burn()
        caps = thread_cap.ThreadCaps(cluster.cpu.cpu_dirs(), cores, cluster.cpu.period_us, full_every=5,
                                     usage_every=1).start()  # a usage sample every 0.1 s
        try:
            began = time.time()
            capped = burn()
            ended = time.time()
        finally:
            hosts = caps.stop()
        host_dir = cluster.cpu.cpu_dirs()[0]
        assert not any(d.is_dir() for d in host_dir.iterdir())
    # Alone in a host of 4 dilated CPUs the thread takes most of the host's 0.4 cores; capped, one CPU's 0.1 (plus
    # the period under way and the kernel's runtime slice handed out ahead).
    assert free["cpu_s"] > 0.25 * seconds, free
    assert capped["cpu_s"] <= cores * seconds + 0.05, capped
    assert capped["cgroup"].endswith(f"/t{capped['tid']}"), capped
    assert hosts[0].placed >= 2  # the main thread and the burner
    assert hosts[0].throttled_s > 0.5 * seconds, hosts[0]
    # The per-thread usage (thread_usage.py) names the burner as its process's busiest thread, at its cap and
    # throttled most of the window, as the kernel's own accounts above say.
    (busiest, *_), = caps.usage.summary(began, ended, cores).values()
    name, cap_pct, throttled_pct, _ = busiest
    assert name == "burner" and 60 <= cap_pct <= 110 and throttled_pct > 40, caps.usage.summary(began, ended, cores)


# A capped main thread starts a GPU-side thread (as a worker starts the virtual GPU's timer) and makes it real-time.
GPU_SIDE_CHILD = r"""
import json, threading, time
from benchmarks.emulation import emulated_compute, thread_cap
time.sleep(1.0)  # the runner's scanner caps this thread first
stop = threading.Event()
with thread_cap.gpu_side():
    timer = threading.Thread(target=stop.wait)
    timer.start()
said = emulated_compute.run_timer_as_gpu(timer.native_id)
out = {"said": said, "timer": emulated_compute._cpu_group(timer.native_id),
       "main": emulated_compute._cpu_group(threading.get_native_id())}
stop.set()
timer.join()
print(json.dumps(out))
"""


@pytest.mark.system
def test_a_gpu_side_thread_of_a_capped_thread_leaves_its_cap_and_runs_real_time():
    _skip_without_thread_caps()
    repo = pathlib.Path(__file__).resolve().parents[1]
    with emulated_cluster.EmulatedCluster(1, None, cpu_groups=True) as cluster:
        cluster.set_cpu_quota(0.4)
        caps = thread_cap.ThreadCaps(cluster.cpu.cpu_dirs(), 0.1, cluster.cpu.period_us).start()
        try:
            done = cluster.run(0, [sys.executable, "-c", GPU_SIDE_CHILD], capture_output=True, text=True,
                               timeout=60, check=True, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)})
        finally:
            hosts = caps.stop()
    out = json.loads(done.stdout)
    assert out["said"].startswith("real-time"), out  # refused in its creator's group, then allowed in its host's
    assert out["main"].rpartition("/")[2].startswith("t"), out  # the main thread stayed capped
    assert out["timer"] == out["main"].rpartition("/")[0], out  # the timer in the host's own group
    assert hosts[0].gpu_side == 1 and hosts[0].placed >= 1, hosts[0]


@pytest.mark.system
def test_a_capped_run_caps_its_threads_after_start_up_and_before_its_timed_window(tmp_path):
    """p3kv on 2 emulated hosts with --thread-cap: the workers say when their models are built, the caps begin
    then (start-up at the host's quota), before the timed window, and the row says how long before."""
    _skip_without_thread_caps()
    out = tmp_path / "capped.csv"
    cmd = [sys.executable, "-m", "benchmarks.suites.cluster_bench", "--model", "resnet50", "--hosts", "2",
           "--bandwidth", "400mbit", "--gpu-scale", "0.2", "--kvstore", "p3", "--warmup", "2", "--iters", "2",
           "--repeats", "1", "--batch-size", "4", "--csv", str(out), "--timeout", "240", "--smoke", "--force",
           "--allow-dirty", "--untuned", "--thread-cap"]
    repo = pathlib.Path(__file__).resolve().parents[1]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=repo, timeout=600, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    (row,) = bench_rows.read_runs(out)
    assert row["thread_cap_cores"] == "0.2" and all(int(n) >= 2 for n in row["threads_capped"].split(";")), row
    assert float(row["thread_caps_lead_s"]) > 0, row  # began before the timed window
    assert row["omp_threads"] == "4", row  # the host's CPUs (cluster_bench's default 4), one OpenMP thread each
    assert "per-thread caps" not in row["fidelity_notes"], row["fidelity_notes"]
    # Each role's busiest threads in the timed window, by their own names: p3kv's C++ threads name themselves
    # (cpp/src/thread_name.h), so the server's receive and consumer threads are told apart from Python's.
    busiest = json.loads(row["thread_cpu"])
    assert {"server", "worker"} <= busiest.keys(), busiest
    names = [name for name, _, _, _ in busiest["server"]]
    assert any(n.startswith("p3-srv-recv-w") for n in names) and "p3-consume" in names, busiest
    assert all(cap >= 0 and 0 <= held <= 100 for _, cap, held, _ in busiest["server"]), busiest
    # ... and by where each sleeps (/proc/<tid>/wchan): a receive thread waiting on its socket (a read or the poll
    # before it), the consumer on its queue's condition variable; that is how ps-lite's threads, all named
    # "python", are told apart.
    where = {name: w for name, _, _, w in busiest["server"]}
    assert all(w in ("recv", "poll") for n, w in where.items() if n.startswith("p3-srv-recv-w")), busiest
    assert where["p3-consume"] == "futex", busiest
