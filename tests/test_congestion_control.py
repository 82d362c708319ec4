"""TCP's congestion control as a condition of the emulation (issue 26 item 5): the machine's default recorded in every
row, CUBIC set per route when asked, the `cubic` sweep at the headline points, rows of different algorithms kept
apart (resume, tables, the simulator), and the comparison with the reference rows generated from them."""

import dataclasses
import json
import pathlib
import re
import sys

import pytest

from benchmarks.analysis import bench_rows, variant
from benchmarks.analysis import points as point_stats
from benchmarks.emulation import emulated_cluster, link_shaping
from benchmarks.sim import validate
from benchmarks.suites import cluster_bench, sweeps

BANDWIDTH = pathlib.Path(sweeps.RESULTS) / "bandwidth.csv"


def _proc(tmp_path: pathlib.Path, default: str, available: str) -> str:
    (tmp_path / "tcp_congestion_control").write_text(default + "\n")
    (tmp_path / "tcp_available_congestion_control").write_text(available + "\n")
    return str(tmp_path)


@pytest.mark.unit
def test_the_machines_default_is_read_and_an_algorithm_the_kernel_lacks_is_refused_naming_the_fix(tmp_path):
    proc = _proc(tmp_path, "bbr", "reno bbr cubic")
    assert link_shaping.machine_congestion_control(proc) == "bbr"
    link_shaping.check_congestion_control("cubic", proc)  # loaded: nothing to say
    with pytest.raises(ValueError, match=r"'vegas' is not loaded \(available: reno, bbr, cubic\): modprobe tcp_vegas"):
        link_shaping.check_congestion_control("vegas", proc)


@pytest.mark.unit
def test_a_sweep_under_an_algorithm_the_kernel_lacks_is_refused_before_any_cluster_is_built():
    points = sweeps.SWEEPS["cubic"](sweeps.parse_args(["cubic"]))
    assert cluster_bench.congestion_problem([dataclasses.replace(p, tcp_congestion=None) for p in points]) is None
    machine = link_shaping.machine_congestion_control()
    assert cluster_bench.congestion_problem([dataclasses.replace(points[0], tcp_congestion=machine)]) is None
    lacking = [dataclasses.replace(p, tcp_congestion="nosuchcc") for p in points]
    assert "'nosuchcc' is not loaded" in cluster_bench.congestion_problem(lacking)
    assert "modprobe tcp_nosuchcc" in cluster_bench.congestion_problem(lacking)


@pytest.mark.unit
def test_the_cubic_sweep_runs_the_bandwidth_sweeps_headline_points_under_cubic_and_nothing_else_changes():
    args = sweeps.parse_args(["cubic"])
    points = sweeps.SWEEPS["cubic"](args)
    equivalents = {(p.model, round(emulated_cluster.parse_rate(p.bandwidth) / p.gpu_scale / 1e9, 3)) for p in points}
    assert equivalents == {("resnet50_v1", 4.0), ("vgg19", 15.0)}
    assert {p.kvstore for p in points} == set(sweeps.SYSTEMS) and {p.tag for p in points} == {"cubic"}
    assert {p.tcp_congestion for p in points} == {"cubic"} and "cubic" in sweeps.ALL
    reference = [dataclasses.replace(p, tag="cubic", tcp_congestion="cubic") for p in sweeps.sweep_bandwidth(args)]
    assert all(p in reference for p in points)  # the bandwidth sweep's points, the algorithm aside
    assert {p.tcp_congestion for p in sweeps.sweep_bandwidth(args)} == {None}  # the others: the machine's
    args = cluster_bench.parse_args(["--tcp-congestion", "cubic"])
    assert {p.tcp_congestion for p in cluster_bench.points_from_args(args)} == {"cubic"}


@pytest.mark.unit
def test_an_algorithm_the_kernel_lacks_is_refused_when_the_options_are_read_before_any_cluster_is_built(capsys):
    from benchmarks.suites import tune

    for parse in (cluster_bench.parse_args, tune.parse_args):
        with pytest.raises(SystemExit):
            parse(["--tcp-congestion", "nosuch"])
        assert "argument --tcp-congestion: TCP congestion control 'nosuch' is not loaded" in capsys.readouterr().err
        assert parse(["--tcp-congestion", "cubic"]).tcp_congestion == "cubic"


@pytest.mark.unit
def test_rows_under_another_algorithm_are_another_point_and_rows_from_before_the_column_ran_bbr():
    point = next(p for p in sweeps.SWEEPS["cubic"](sweeps.parse_args(["cubic"])) if p.kvstore == "p3")
    settings = sweeps._settings(point)
    assert settings["tcp_congestion_control"] == "cubic"
    row = {k: ("" if v is None else str(v)) for k, v in settings.items()}
    assert sweeps._signature(row) == sweeps._signature(settings)
    older = {**row, "tcp_congestion_control": ""}
    assert sweeps._signature(older) == sweeps._signature({**row, "tcp_congestion_control": "bbr"})
    assert sweeps._signature(older) != sweeps._signature(row)
    assert point_stats.key_value(older, "tcp_congestion_control") == "bbr"
    assert point_stats.key_value(row, "tcp_congestion_control") == "cubic"
    assert "tcp_congestion_control" in bench_rows.RUN_COLUMNS


def _as_cubic(row: dict, slower: float) -> dict:
    """A bandwidth-sweep row as the cubic sweep would have written it, every iteration `slower` times as long."""
    ranks = [[t * slower for t in times] for times in bench_rows.rank_iterations(row)]
    return {**row, "tag": "cubic", "tcp_congestion_control": "cubic", "rank_iter_s": json.dumps(ranks),
            "iter_s": json.dumps(ranks[0])}


@pytest.mark.unit
def test_the_comparison_with_the_reference_rows_matches_each_system_at_the_same_point_and_gives_the_ratio():
    reference = bench_rows.read_runs(BANDWIDTH)
    at = [r for r in reference if r["model"] == "resnet50_v1" and point_stats.equivalent_gbps(r) == 4.0]
    assert {r["kvstore"] for r in at} >= {"p3", "dist_sync"}, "the bandwidth sweep's ResNet-50 4 Gbps rows"
    rows = [_as_cubic(r, 1.25 if r["kvstore"] == "dist_sync" else 1.0) for r in at]
    lines = variant.sentences(rows, reference, "tcp_congestion_control", "sweeps/bandwidth.csv")
    assert len(lines) == 1 and "under CUBIC against BBR" in lines[0], lines
    ratios = dict(re.findall(r"(p3kv|dist_sync) [\d,.]+ against [\d,.]+ \(([\d.]+)×", lines[0]))
    assert ratios == {"p3kv": "1.000", "dist_sync": "0.800"}, lines[0]
    # Nothing to compare where the reference has no such point.
    assert variant.sentences(rows, [r for r in reference if r["model"] != "resnet50_v1"],
                             "tcp_congestion_control", "x") == []


@pytest.mark.unit
def test_the_simulator_validates_only_on_bbr_rows(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "legacy"} for r in bench_rows.read_runs(BANDWIDTH)
            if r["model"] == "resnet50_v1" and r.get("faithful") == "True"][:4]
    (tmp_path / "sweeps").mkdir()
    for row in rows:
        bench_rows.write_run(tmp_path / "sweeps" / "bbr.csv", {**row, "tcp_congestion_control": "bbr"})
        bench_rows.write_run(tmp_path / "sweeps" / "cubic.csv", _as_cubic(row, 1.0))
    points, _ = validate.measured_points(tmp_path)
    assert points and {p["source"] for p in points} == {"sweeps/bbr.csv"}


@pytest.mark.system
def test_the_links_run_the_algorithm_asked_for_on_both_ends_of_a_connection():
    reason = emulated_cluster.why_unavailable()
    if reason:
        pytest.skip(reason)
    with emulated_cluster.EmulatedCluster(2, "200mbit") as cluster:
        with pytest.raises(ValueError, match="modprobe tcp_nosuch"):
            cluster.set_transport(None, "nosuch")
        assert cluster.congestion_control is None
        cluster.set_transport(2000.0, "cubic")
        route = cluster.run(0, ["ip", "route", "show", f"{emulated_cluster.SUBNET}.0/24"], capture_output=True,
                            text=True).stdout
        assert "congctl cubic" in route and re.search(r"rto_min (lock )?(2s|2000ms)", route), route
        server = (f"import socket, time\ns = socket.create_server(('{cluster.address(1)}', 5701))\nprint('up', "
                  "flush=True)\nc, _ = s.accept()\nwhile c.recv(65536):\n    pass")
        receiver = cluster.popen(1, [sys.executable, "-c", server], stdout=-1, text=True)
        try:
            assert receiver.stdout.readline() == "up\n"
            client = (f"import socket, subprocess\nc = socket.create_connection(('{cluster.address(1)}', 5701))\n"
                      "c.sendall(b'x' * 1_000_000)\nprint(subprocess.run(['ss', '-tin', 'dport = :5701'], "
                      "capture_output=True, text=True).stdout)")
            shown = cluster.run(0, [sys.executable, "-c", client], capture_output=True, text=True, timeout=30).stdout
            assert re.search(r"\bcubic\b", shown), shown  # the sender's socket
        finally:
            receiver.kill()
            receiver.wait()
        cluster.set_transport(None)
        assert cluster.congestion_control is None
        route = cluster.run(0, ["ip", "route", "show", f"{emulated_cluster.SUBNET}.0/24"], capture_output=True,
                            text=True).stdout
        assert "congctl" not in route and "rto_min" not in route, route


@pytest.mark.unit
def test_the_tables_and_the_readme_headline_name_the_algorithm_their_rows_ran():
    from benchmarks.report import headline, sweep_blocks

    results = pathlib.Path(sweeps.RESULTS).parent
    assert "links under TCP BBR" in sweep_blocks.reviewed_block("bandwidth", results)
    assert "links under TCP BBR with compute slowed" in headline.headline_block(results)


@pytest.mark.unit
def test_the_readme_lines_give_p3kvs_ratios_and_each_systems_move_under_the_other_algorithm(tmp_path):
    from benchmarks.report import sweep_blocks

    reference = [{k: v for k, v in r.items() if k != "legacy"} for r in bench_rows.read_runs(BANDWIDTH)
                 if r["model"] == "resnet50_v1" and point_stats.equivalent_gbps(r) == 4.0]
    (tmp_path / "sweeps").mkdir()
    assert sweep_blocks.variant_summary("cubic", tmp_path).startswith("Not measured yet")
    for row in reference:
        bench_rows.write_run(tmp_path / "sweeps" / "bandwidth.csv", row)
        bench_rows.write_run(tmp_path / "sweeps" / "cubic.csv",
                             _as_cubic(row, 1.25 if row["kvstore"] == "dist_sync" else 1.0))
    text = sweep_blocks.variant_summary("cubic", tmp_path)
    assert text.startswith("Under CUBIC instead of BBR") and "resnet50_v1 at 4 Gbps" in text, text
    assert "Every system at the setting it ran under BBR" in text, text  # no grid ran under CUBIC here
    (tmp_path / "tuning").mkdir()
    (tmp_path / "tuning" / "best.json").write_text(json.dumps({"resnet50_v1.440mbit.4h.x0.11.emulated.tcp-cubic": {
        "p3": {"label": "P3_SLICE_SIZE=25000 (tuned)"}}, "resnet50_v1.440mbit.4h.x0.11.emulated": {
        "horovod": {"label": "HOROVOD_CYCLE_TIME=5 (tuned)"}}}))
    text = sweep_blocks.variant_summary("cubic", tmp_path)
    assert ("Each system at the setting its grid chose under CUBIC where one ran (p3kv at resnet50_v1 "
            "(P3_SLICE_SIZE=25000 (tuned), `results/tuning/resnet50_v1.440mbit.4h.x0.11.emulated.tcp-cubic.md`)), "
            "else the one it ran under BBR") in text, text
    assert re.search(r"resnet50_v1 .*p3kv 1\.00×.*dist_sync 0\.80×", text.split("same point")[1]), text


@pytest.mark.unit
def test_a_grid_under_another_algorithm_is_its_own_point_and_comparisons_fall_back_to_the_machines_best():
    from benchmarks.suites import baseline_settings, tune

    args = tune.parse_args(["--model", "resnet50_v1", "--equivalent", "4", "--systems", "p3",
                            "--tcp-congestion", "cubic"])
    (base,) = tune.base_points(args)
    assert base.tcp_congestion == "cubic"
    assert baseline_settings.point_key(base) == "resnet50_v1.440mbit.4h.x0.11.emulated.tcp-cubic"
    assert baseline_settings.comparison_key(base).endswith(".tcp-cubic")
    point = next(p for p in sweeps.SWEEPS["cubic"](sweeps.parse_args(["cubic"]))
                 if p.kvstore == "p3" and p.model == "resnet50_v1")
    machine = dataclasses.replace(point, tcp_congestion=None)
    entry = {"setting": {"P3_SLICE_SIZE": "25000"}, "label": "P3_SLICE_SIZE=25000 (tuned)", "gpu_scale": 0.11}
    best = {baseline_settings.point_key(machine): {"p3": entry}}
    assert baseline_settings.tuned(point, best) == ((("P3_SLICE_SIZE", "25000"),), "P3_SLICE_SIZE=25000 (tuned)")
    own = {"setting": {"P3_SOCKET_BUFFER": "524288"}, "label": "P3_SOCKET_BUFFER=524288 (tuned)", "gpu_scale": 0.11}
    best[baseline_settings.point_key(point)] = {"p3": own}
    assert baseline_settings.tuned(point, best)[0] == (("P3_SOCKET_BUFFER", "524288"),)
    assert baseline_settings.tuned(machine, best)[0] == (("P3_SLICE_SIZE", "25000"),)  # BBR keeps its own
