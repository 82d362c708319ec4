"""`make sweeps-estimate` from measured durations: a point measured before (at any dilation) is estimated from its
own rows, scaled to the dilation it will run at; the others from the bound times the measured slowdown; the
time outside the timed iterations from CPU-limited runs once there are enough of them."""

import dataclasses

import pytest

from benchmarks.analysis import bench_rows
from benchmarks.suites import sweeps

pytestmark = pytest.mark.unit


def _row(kvstore, median_s, wall_s, cpu_limit="off", scale=0.5, smoke="False", run=0):
    return {"status": "ok", "smoke": smoke, "compute": "emulated", "model": "resnet50_v1", "kvstore": kvstore,
            "hosts": 4, "layout": "colocated", "p100_equiv_gbps": 10.0, "batch_size": 32, "efficiency_factor": 1.0,
            "slice_size": "", "optimizer": "sgd(momentum=0.9, wd=0.0001)", "gpu_scale": scale, "warmup": 2,
            "iters": 20, "median_s": median_s, "bound_s": median_s / 2, "wall_s": wall_s, "cpu_limit": cpu_limit,
            "run_id": f"{kvstore}.{median_s}.{run}"}


def test_a_measured_point_is_estimated_from_its_own_rows_at_the_new_dilation(tmp_path):
    results = tmp_path / "results"
    # p3 at 10 Gbps-equivalent measured at scale 0.5: 0.4 s/iter, i.e. 0.2 s undilated.
    for run, cpu_limit in enumerate(("off", "cgroup-v1", "cgroup-v1", "cgroup-v1")):
        bench_rows.write_run(results / "sweeps" / "demo.csv",
                             _row("p3", 0.4 if cpu_limit == "off" else 0.5, 60.0, cpu_limit, run=run))
    bench_rows.write_run(results / "tuning" / "x.csv", _row("dist_sync", 0.6, 40.0, run=9))
    bench_rows.write_run(results / "sweeps" / "demo.csv", _row("horovod", 9.9, 99.0, smoke="True"))  # not counted
    bench_rows.write_run(results / "legacy" / "sweep_x.csv", _row("mxnet-p3", 9.9, 99.0))  # older settings
    factors = sweeps.measured_factors(results)
    assert len(sweeps.measured_rows(results)) == 5
    # CPU-limited rows decide a point's time where it has any: 0.5 s x 0.5 = 0.25 s undilated.
    points = {p.kvstore: p for p in sweeps.sweep_demo(sweeps.parse_args(["demo"]))}
    scale = points["p3"].gpu_scale
    # Overhead: the three CPU-limited runs' (60 - 22 x 0.5 = 49 s), plus the run guard's idle sample.
    assert factors.overhead_s == pytest.approx(49.0 + sweeps.GATE_S)
    assert sweeps.point_seconds(points["p3"], factors) == (pytest.approx(22 * 0.25 / scale + factors.overhead_s),
                                                           True)
    assert sweeps.point_seconds(points["dist_sync"], factors) == (pytest.approx(22 * 0.3 / scale
                                                                                + factors.overhead_s), True)
    seconds, measured = sweeps.point_seconds(points["horovod"], factors)  # never measured: the bound's way
    assert not measured and seconds > factors.overhead_s
    assert sweeps.estimate_seconds([points["p3"]], 3, factors) == pytest.approx(3 * (22 * 0.25 / scale
                                                                                     + factors.overhead_s))
    assert "1 points with their own" not in factors.source and "2 points with their own" in factors.source


def test_without_rows_the_estimate_uses_the_bound_and_says_so(tmp_path):
    factors = sweeps.measured_factors(tmp_path)
    assert (factors.overhead_s, factors.slowdown, factors.source, dict(factors.per_iteration)) == (
        30.0, 1.15, "defaults", {})
    rows, source = sweeps.estimates(sweeps.parse_args(["estimate"]), tmp_path / "sweeps")
    assert "s/iter: 0 of" in source and [name for name, _, _ in rows] == list(sweeps.ALL)


def test_a_model_and_system_with_runs_of_their_own_get_their_own_start_up_time(tmp_path):
    # A torch job of VGG-19 builds its model for about two minutes; one median for every job made VGG-19's torch
    # sweep take 1.5 times its estimate. Three runs of a (model, system) are enough for its own; fewer are not.
    results = tmp_path / "results"
    for run in range(3):
        bench_rows.write_run(results / "sweeps" / "demo.csv", _row("p3", 0.5, 21.0, "cgroup-v1", run=run))  # 10 s
        bench_rows.write_run(results / "sweeps" / "demo.csv", _row("dist_sync", 0.5, 21.0, "cgroup-v1", run=run))
        bench_rows.write_run(results / "sweeps" / "demo.csv", _row("mxnet-p3", 0.5, 21.0, "cgroup-v1", run=run))
        bench_rows.write_run(results / "sweeps" / "demo.csv", _row("horovod", 0.5, 141.0, "cgroup-v1", run=run))
    bench_rows.write_run(results / "sweeps" / "demo.csv", {**_row("p3", 0.5, 141.0, "cgroup-v1", run=7),
                                                           "model": "vgg19"})  # one run: not its own yet
    factors = sweeps.measured_factors(results)
    assert factors.overhead_s == pytest.approx(10.0 + sweeps.GATE_S)  # the median of all 13
    assert factors.overhead_by == {(m, kv): pytest.approx(s + sweeps.GATE_S) for m, kv, s in (
        ("resnet50_v1", "p3", 10.0), ("resnet50_v1", "dist_sync", 10.0), ("resnet50_v1", "mxnet-p3", 10.0),
        ("resnet50_v1", "horovod", 130.0))}
    assert "4 model and system pairs with their own" in factors.source
    points = {p.kvstore: p for p in sweeps.sweep_demo(sweeps.parse_args(["demo"]))}
    iterations = 22 * 0.25 / points["p3"].gpu_scale
    assert sweeps.point_seconds(points["horovod"], factors)[0] == pytest.approx(iterations + 130.0 + sweeps.GATE_S)
    assert sweeps.point_seconds(points["p3"], factors)[0] == pytest.approx(iterations + 10.0 + sweeps.GATE_S)
    vgg = dataclasses.replace(points["p3"], model="vgg19")  # its iteration time measured, its start-up not yet
    assert sweeps.point_seconds(vgg, factors) == (pytest.approx(iterations + factors.overhead_s), True)
