"""CPU-limited emulated hosts without root: the quota arithmetic and its refusal, the kernel's counters parsed
from captured text, the hierarchy found in a fake /sys/fs/cgroup, the shell that puts a process into its group
before it runs anything, and the timed window cut from samples."""

import os
import subprocess
import sys

import pytest

from benchmarks.emulation import cpu_limit, cpu_sampler
from benchmarks.emulation.cpu_limit import CpuUsage
from benchmarks.suites import cluster_bench, sweeps

pytestmark = pytest.mark.unit

V1_STAT = "nr_periods 1200\nnr_throttled 300\nthrottled_time 4500000000\nnr_bursts 0\nburst_time 0\n"
V2_STAT = ("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\nnr_periods 40\nnr_throttled 10\n"
           "throttled_usec 750000\nnr_bursts 0\nburst_usec 0\n")


def test_quota_is_host_cpus_times_the_dilation():
    assert cpu_limit.quota_cores(2, 0.1) == pytest.approx(0.2)
    assert cpu_limit.largest_fitting_scale(4, 2, 2) == pytest.approx(0.225)  # 0.9 x 2 cores over 4 x 2 CPUs
    assert cpu_limit.largest_fitting_scale(8, 2, 2) == pytest.approx(0.1125)
    assert cpu_limit.check_fits(4, 2, 0.2, cpus=2) == pytest.approx(0.4)
    assert cpu_limit.check_fits(4, 2, 0.225, cpus=2) == pytest.approx(0.45)  # exactly 90% fits
    with pytest.raises(ValueError, match="positive"):
        cpu_limit.quota_cores(0, 0.1)


def test_a_point_past_ninety_percent_is_refused_naming_the_largest_scale_that_fits():
    with pytest.raises(cpu_limit.QuotaRefused) as refused:
        cpu_limit.check_fits(4, 2, 0.3, cpus=2)
    message = str(refused.value)
    assert "2.4 cores" in message and "90% of this machine's 2 cores" in message
    assert "--gpu-scale 0.225 or less" in message and "--no-cpu-limit" in message


def test_points_are_checked_before_any_run():
    cpus = os.cpu_count() or 1
    too_big = cluster_bench.Point(model="resnet50_v1", kvstore="p3", hosts=8, gpu_scale=1, host_cpus=cpus)
    with pytest.raises(cpu_limit.QuotaRefused, match="--gpu-scale"):
        cluster_bench.check_cpu_limits([cluster_bench.Point(model="resnet50_v1", kvstore="p3"), too_big])
    # No limit (host_cpus None) and compute that is not dilated are never refused.
    assert cluster_bench.Point(model="m", kvstore="p3", gpu_scale=1).cpu_quota is None
    assert cluster_bench.Point(model="m", kvstore="p3", compute="real", host_cpus=2).cpu_quota is None
    assert cluster_bench.Point(model="m", kvstore="p3", gpu_scale=0.1, host_cpus=2).cpu_quota == pytest.approx(0.2)


def test_sweeps_pick_a_dilation_within_the_quotas():
    assert sweeps.cpu_fit(4, None) == 1.0
    fit = sweeps.cpu_fit(4, 2)
    cpus = os.cpu_count() or 1
    assert fit <= cpu_limit.largest_fitting_scale(4, 2, cpus) and fit == round(fit, 2)
    args = sweeps.parse_args(["bandwidth"])
    for p in sweeps.SWEEPS["bandwidth"](args) + sweeps.SWEEPS["scale"](args) + sweeps.SWEEPS["dilation"](args):
        # Each model's own CPUs per host (VGG-19 needs 8), and a dilation at which its quotas fit.
        assert p.host_cpus == cluster_bench.MODEL_HOST_CPUS.get(p.model, cluster_bench.DEFAULT_HOST_CPUS)
        cpu_limit.check_fits(p.hosts, p.host_cpus, p.gpu_scale, cpus)  # every planned point fits
    assert {p.host_cpus for p in sweeps.SWEEPS["dilation"](args) if p.model == "vgg19"} == {8.0}
    off = sweeps.parse_args(["bandwidth", "--no-cpu-limit"])
    assert {p.host_cpus for p in sweeps.SWEEPS["bandwidth"](off)} == {None}
    given = sweeps.parse_args(["bandwidth", "--host-cpus", "6"])  # --host-cpus wins over every model's default
    assert {p.host_cpus for p in sweeps.SWEEPS["bandwidth"](given)} == {6.0}


def test_counters_parse_from_v1_and_v2_text():
    assert cpu_limit.parse_stat(V1_STAT)["nr_throttled"] == 300
    v1 = cpu_limit.usage_v1(V1_STAT, "3000000000\n")
    assert v1 == CpuUsage(cpu_s=3.0, throttled_s=4.5, periods=1200, throttled_periods=300)
    assert v1.throttled_period_share == pytest.approx(0.25)
    assert cpu_limit.usage_v1(V1_STAT, None).cpu_s == 0.0  # no cpuacct: CPU time unknown
    assert cpu_limit.usage_v2(V2_STAT) == CpuUsage(cpu_s=2.5, throttled_s=0.75, periods=40, throttled_periods=10)
    assert (v1 - CpuUsage(1.0, 0.5, 200, 100)) == CpuUsage(2.0, 4.0, 1000, 200)
    assert CpuUsage().throttled_period_share == 0.0


def test_window_takes_the_samples_that_cover_it():
    samples = [(float(t), [CpuUsage(cpu_s=t, throttled_s=t / 10)]) for t in range(11)]
    [usage] = cpu_sampler.window(samples, 2.5, 6.2)  # from the sample at 2 to the one at 7
    assert usage.cpu_s == pytest.approx(5.0) and usage.throttled_s == pytest.approx(0.5)
    [whole] = cpu_sampler.window(samples, -5, 50)
    assert whole.cpu_s == pytest.approx(10.0)
    assert cpu_sampler.window([], 0, 1) == []


def _fake_v1(root):
    for controller, knob in (("cpu", "cpu.cfs_quota_us"), ("cpuacct", "cpuacct.usage")):
        (root / controller).mkdir(parents=True)
        (root / controller / knob).write_text("0\n")
    return root


def _kernel_files_go(root):
    """What rmdir does to a real group's files: the fake groups' files are removed, so that close() can remove
    the directories at once instead of retrying until its timeout."""
    for f in root.glob("*/p3c*/*"):
        f.unlink()


def test_hierarchy_v1_then_v2_else_an_error_that_says_what_to_do(tmp_path):
    v1 = cpu_limit.find_hierarchy(_fake_v1(tmp_path / "a"))
    assert (v1.version, v1.cpu.name, v1.cpuacct.name) == (1, "cpu", "cpuacct")
    v2_root = tmp_path / "b" / "unified"
    v2_root.mkdir(parents=True)
    (v2_root / "cgroup.controllers").write_text("cpu memory pids\n")
    (v2_root / "cgroup.subtree_control").write_text("\n")
    v2 = cpu_limit.find_hierarchy(tmp_path / "b")
    assert (v2.version, v2.cpu) == (2, v2_root)
    assert (v2_root / "cgroup.subtree_control").read_text() == "+cpu"  # enabled for the children
    none = tmp_path / "c" / "unified"
    none.mkdir(parents=True)
    (none / "cgroup.controllers").write_text("hugetlb\n")  # this machine's v2: cpu not delegated
    with pytest.raises(cpu_limit.CpuLimitError, match="--no-cpu-limit") as error:
        cpu_limit.find_hierarchy(tmp_path / "c")
    assert "/sys/fs/cgroup/cpu" in str(error.value) and "subtree_control" in str(error.value)


def test_groups_write_the_quota_and_read_their_counters(tmp_path):
    root = _fake_v1(tmp_path)
    limits = cpu_limit.HostCpuLimits(["p3c1x0h0", "p3c1x0h1"], cpu_limit.find_hierarchy(root))
    limits.start()
    group = root / "cpu" / "p3c1x0h0"
    assert (group / "cpu.cfs_period_us").read_text() == str(cpu_limit.PERIOD_US) == "10000"
    assert (group / "cpu.cfs_quota_us").read_text() == "-1"  # accounting only until a quota is set
    limits.set_quota(0.25)
    assert (group / "cpu.cfs_quota_us").read_text() == "2500" and limits.quota == 0.25  # 0.25 cores of 10 ms
    # Under 0.1 cores the quota would fall below the kernel's 1 ms: the period grows instead, the share stays.
    limits.set_quota(0.04)
    assert (group / "cpu.cfs_period_us").read_text() == "25000" and (group / "cpu.cfs_quota_us").read_text() == "1000"
    assert limits.period_us == 25000
    # A period given per run (a point's cfs_period_gpu_ms, dilated): the same share over a longer period.
    limits.set_quota(0.2, 20_000)
    assert (group / "cpu.cfs_period_us").read_text() == "20000" and (group / "cpu.cfs_quota_us").read_text() == "4000"
    limits.set_quota(0.25)
    assert (group / "cpu.cfs_period_us").read_text() == "10000"  # the limits' own base again
    (group / "cpu.stat").write_text(V1_STAT)
    (root / "cpuacct" / "p3c1x0h0" / "cpuacct.usage").write_text("3000000000\n")
    assert limits.groups[0].usage().cpu_s == 3.0
    for name in ("cpu.cfs_period_us", "cpu.cfs_quota_us", "cpu.stat"):  # a real cgroup's files go with it
        (group / name).unlink()
    (root / "cpuacct" / "p3c1x0h0" / "cpuacct.usage").unlink()
    for name in ("cpu.cfs_period_us", "cpu.cfs_quota_us"):
        (root / "cpu" / "p3c1x0h1" / name).unlink()
    limits.close()
    assert not group.exists() and not (root / "cpuacct" / "p3c1x0h1").exists()


def test_a_wrapped_process_joins_its_group_before_it_runs(tmp_path):
    root = _fake_v1(tmp_path)
    limits = cpu_limit.HostCpuLimits(["p3c1x0h0"], cpu_limit.find_hierarchy(root))
    for d in limits.groups[0].dirs:
        d.mkdir()
    # The command prints its own pid: the same process (exec, no fork) wrote it into both controllers' groups.
    done = subprocess.run(limits.wrap(0, [sys.executable, "-c", "import os; print(os.getpid())"]),
                          capture_output=True, text=True, timeout=30, check=True)
    pid = done.stdout.strip()
    for d in limits.groups[0].dirs:
        assert (d / "cgroup.procs").read_text().strip() == pid
    # A group that cannot be joined stops the command before it starts.
    failed = subprocess.run(cpu_limit.HostCpuLimits(["p3c1x0h9"], limits.hierarchy).wrap(0, ["echo", "ran"]),
                            capture_output=True, text=True, timeout=30)
    assert failed.returncode == 125 and "ran" not in failed.stdout


def test_stale_groups_of_dead_runners_are_removed(tmp_path):
    root = _fake_v1(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    for controller in ("cpu", "cpuacct"):
        (root / controller / f"p3c{dead.pid}x0h0").mkdir()
        (root / controller / f"p3c{os.getpid()}x0h0").mkdir()  # alive: kept
    removed = cpu_limit.cleanup_stale(root)
    assert sorted(removed) == sorted(str(root / c / f"p3c{dead.pid}x0h0") for c in ("cpu", "cpuacct"))
    assert (root / "cpu" / f"p3c{os.getpid()}x0h0").exists()


def test_the_machines_bandwidth_slice_is_set_while_the_groups_exist_and_restored(tmp_path):
    root = _fake_v1(tmp_path)
    slice_file = tmp_path / "sched_cfs_bandwidth_slice_us"
    slice_file.write_text("5000\n")
    limits = cpu_limit.HostCpuLimits(["p3c1x0h0"], cpu_limit.find_hierarchy(root), slice_file=slice_file).start()
    assert slice_file.read_text() == str(cpu_limit.BANDWIDTH_SLICE_US) and limits.bandwidth_slice_us == 1000
    _kernel_files_go(root)
    limits.close()
    assert slice_file.read_text() == "5000"
    # Without a slice file (a fake hierarchy, another kernel) nothing is touched and nothing is claimed.
    alone = cpu_limit.HostCpuLimits(["p3c1x0h1"], cpu_limit.find_hierarchy(root)).start()
    assert alone.bandwidth_slice_us is None
    _kernel_files_go(root)
    alone.close()
    assert not list(root.glob("*/p3c*"))


def test_adopted_threads_go_to_the_hosts_tasks_and_back_to_the_root(tmp_path):
    root = _fake_v1(tmp_path)
    limits = cpu_limit.HostCpuLimits(["p3c1x0h0", "p3c1x0h1"], cpu_limit.find_hierarchy(root)).start()
    limits.adopt(1, [4242])
    for controller in ("cpu", "cpuacct"):
        assert (root / controller / "p3c1x0h1" / "tasks").read_text() == "4242"
        assert not (root / controller / "p3c1x0h0" / "tasks").exists()
    limits.release([4242])
    for controller in ("cpu", "cpuacct"):
        assert (root / controller / "tasks").read_text() == "4242"
    _kernel_files_go(root)
    limits.close()
    assert not list(root.glob("*/p3c*"))


def test_a_points_cfs_period_is_given_in_the_gpus_time_and_dilated():
    import dataclasses

    from benchmarks.suites.cluster_job import Point

    point = Point(model="resnet50_v1", kvstore="p3", hosts=4, bandwidth="200mbit", gpu_scale=0.05, host_cpus=4)
    assert point.cfs_period_gpu_ms == 1.0 and point.cfs_period_real_us == 20_000  # 1 ms of GPU time at 1/20
    assert point.cfs_period_us == 20_000  # what the groups get: a quota of 4 ms per period, over the 1 ms minimum
    fixed = dataclasses.replace(point, cfs_period_gpu_ms=None)
    assert fixed.cfs_period_real_us is None and fixed.cfs_period_us == 10_000  # the fixed real default
    assert fixed.group() != point.group()  # runs at different periods are not one comparison
    assert dataclasses.replace(point, host_cpus=None).cfs_period_us is None  # no quota, no period
    assert Point(model="resnet50_v1", kvstore="p3", hosts=4, gpu_scale=0.1, host_cpus=4).cfs_period_us == 10_000
    args = cluster_bench.parse_args(["--gpu-scale", "0.1", "--kvstore", "p3"])
    assert cluster_bench.points_from_args(args)[0].cfs_period_real_us == 10_000
    with pytest.raises(SystemExit):
        cluster_bench.parse_args(["--gpu-scale", "0.05", "--cfs-period-gpu-ms", "0.01"])  # 0.2 ms real: refused
    with pytest.raises(cpu_limit.QuotaRefused, match="outside the kernel's"):  # before any run
        cluster_bench.check_cpu_limits([dataclasses.replace(point, gpu_scale=0.0005, bandwidth="2mbit", hosts=2)])
    # --resume: a row run at another period is another run; the sweeps pass the flag on.
    swept = sweeps.sweep_points("dilation", sweeps.parse_args(["dilation", "--cfs-period-gpu-ms", "0.5"]))
    assert {p.cfs_period_gpu_ms for p in swept} == {0.5}
    row = {k: ("" if v is None else str(v)) for k, v in dataclasses.asdict(point).items()}
    assert sweeps._signature({**row, "cfs_period_us": "20000"}) == sweeps._signature(
        {**dataclasses.asdict(point), "cfs_period_us": point.cfs_period_us})
    assert sweeps._signature({**row, "cfs_period_us": "10000"}) != sweeps._signature(
        {**dataclasses.asdict(point), "cfs_period_us": point.cfs_period_us})
