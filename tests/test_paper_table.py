"""The paper-comparison table (benchmarks/report/paper_table.py) from rows written here: faithful rows only, the
gain with its interval beside the paper's, the gap, and "not yet measured" where a gap over 10 points has no
measured explanation."""

import pytest

from benchmarks.analysis import bench_rows
from benchmarks.report import paper_table
from benchmarks.report import readme as report

pytestmark = pytest.mark.unit


def _row(model, kvstore, gbps, seconds, repeat, faithful="True", scale=0.2):
    return {"status": "ok", "smoke": "False", "model": model, "kvstore": kvstore, "hosts": 4, "workers": 4,
            "samples_per_batch": 32, "unit": "images", "p100_equiv_gbps": gbps, "gpu_scale": scale, "repeat": repeat,
            "optimizer": "sgd(momentum=0.9)", "rank_iter_s": [[seconds] * 5 for _ in range(4)],
            "iter_s": [seconds] * 5, "faithful": faithful, "tag": "bandwidth", "run_id": f"{model}{kvstore}{repeat}"}


def _write(path, rows):
    for row in rows:
        bench_rows.write_run(path, row)


@pytest.fixture
def results(tmp_path):
    sweeps = tmp_path / "sweeps"
    rows, dilation = [], []
    for repeat in range(3):
        # VGG-19's claim: while the bandwidth sweep has no faithful run there, the dilation check's point, its
        # dilations pooled in P100-equivalent seconds: p3kv 0.1 s at both scales, dist_sync 0.2 s.
        dilation += [{**_row("vgg19", kv, 15.0, seconds / scale, repeat, scale=scale), "tag": "dilation"}
                     for scale in (0.2, 0.1) for kv, seconds in (("p3", 0.1), ("dist_sync", 0.2))]
        rows += [_row("resnet50_v1", "p3", 4.0, 0.8, repeat), _row("resnet50_v1", "dist_sync", 4.0, 1.0, repeat),
                 _row("resnet50_v1", "p3", 4.0, 0.1, repeat, faithful="False"),  # never used
                 _row("vgg19", "p3", 15.0, 0.9, repeat, faithful=""),  # from before the monitors: not read
                 _row("vgg19", "dist_sync", 15.0, 1.0, repeat, faithful=""),
                 _row("inceptionv3", "p3", 2.0, 1.0, repeat), _row("inceptionv3", "dist_sync", 2.0, 1.1, repeat),
                 _row("inceptionv3", "p3", 10.0, 1.0, repeat), _row("inceptionv3", "dist_sync", 10.0, 1.3, repeat),
                 _row("sockeye", "p3", 10.0, 1.0, repeat, faithful=""),
                 _row("sockeye", "dist_sync", 10.0, 2.0, repeat, faithful="")]
    _write(sweeps / "bandwidth.csv", rows)
    _write(sweeps / "dilation.csv", dilation)
    _write(sweeps / "ablation.csv", [_row("vgg19", kv, 30.0, 1.0, 0, faithful="False")
                                     for kv in ("p3-slicing-only", "dist_sync")])
    return tmp_path


def test_each_claim_beside_ours_from_faithful_runs_with_the_gap(results):
    table = paper_table.paper_table_block(results)
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert lines["ResNet-50"] == ("| ResNet-50 | +26% at 4 Gbps | +25% (+25% … +25%) | 4 Gbps, `bandwidth.csv` | "
                                  "3 / 3 | -1 | no |  |")
    sentence, backing = paper_table.EXPLANATIONS["vgg19"]
    assert lines["VGG-19"] == ("| VGG-19 | +66% at 15 Gbps | +100% (+100% … +100%) | 15 Gbps, `dilation.csv`, its "
                               f"dilations pooled | 6 / 6 | +34 | yes | {sentence} ({backing}) |")
    assert (paper_table.RESULTS_ROOT / backing).exists()  # the measurement behind the sentence is committed
    assert lines["InceptionV3"].startswith("| InceptionV3 | +18% | +30% (+30% … +30%) | 10 Gbps (our largest), ")
    assert lines["Sockeye"] == ("| Sockeye | +38% | no faithful runs yet (6 from before the monitors) | - | 0 | - | - "
                                "| |")
    assert lines["VGG-19, slicing alone"].startswith("| VGG-19, slicing alone | +49% at 30 Gbps | no faithful runs "
                                                     "yet (2 unfaithful) | 30 Gbps |")
    assert "gap > 10 points" in table


def test_an_explanation_is_shown_only_with_the_measurement_behind_it(results, monkeypatch):
    monkeypatch.setitem(paper_table.EXPLANATIONS, "vgg19", ("the sentence", "results/x.csv"))
    assert "| yes | the sentence (results/x.csv) |" in paper_table.paper_table_block(results)
    monkeypatch.delitem(paper_table.EXPLANATIONS, "vgg19")
    assert "| +34 | yes | not yet measured |" in paper_table.paper_table_block(results)


def test_the_table_is_a_block_of_the_benchmark_docs(results):
    assert report.blocks(results)["paper-comparison"]() == paper_table.paper_table_block(results)
    assert "<!-- bench:paper-comparison -->" in report.DOCS.read_text()


def test_a_claim_never_pools_runs_made_under_different_conditions(tmp_path):
    """Faithful runs of one point with threads uncapped and capped (points.POINT_KEY tells them apart): the gain
    comes from the newest conditions alone, here the capped runs (p3kv 0.8 s, dist_sync 1.0 s), never the uncapped
    p3kv runs at 0.5 s."""
    rows = []
    for repeat in range(2):
        rows.append(_row("resnet50_v1", "p3", 4.0, 0.5, repeat))
    for repeat in range(3):
        rows += [{**_row("resnet50_v1", kv, 4.0, s, repeat), "thread_cap_cores": 0.2}
                 for kv, s in (("p3", 0.8), ("dist_sync", 1.0))]
    _write(tmp_path / "sweeps" / "bandwidth.csv", rows)
    line = next(x for x in paper_table.paper_table_block(tmp_path).splitlines() if x.startswith("| ResNet-50 "))
    assert "| +25% (+25% … +25%) | 4 Gbps, `bandwidth.csv` | 3 / 3 |" in line, line


def test_vgg19s_claim_reads_the_bandwidth_sweep_once_it_has_faithful_runs_there(results):
    """The fixture's dilation check says +100%; three faithful bandwidth-sweep repeats (p3kv 0.8 s, dist_sync 1.0
    s) take over, and the dilation check is no longer pooled in."""
    _write(results / "sweeps" / "bandwidth.csv", [_row("vgg19", kv, 15.0, s, repeat) for repeat in range(3)
                                                  for kv, s in (("p3", 0.8), ("dist_sync", 1.0))])
    line = next(x for x in paper_table.paper_table_block(results).splitlines() if x.startswith("| VGG-19 |"))
    assert "| +25% (+25% … +25%) | 15 Gbps, `bandwidth.csv` | 3 / 3 | -41 | yes |" in line, line


def test_a_gain_the_point_cannot_allow_is_explained_by_the_baselines_distance_to_the_bound(tmp_path):
    """Sockeye, faithful runs with their bound: dist_sync at 1/1.25 = 80% of it, p3kv at 90%. The paper's +38% is
    more than a system sending dist_sync's bytes could gain there (+25%), and the table says so with the numbers
    and their file; once the baseline is far enough from the bound (50%: +100% possible) the gap stays "not yet
    measured"."""
    def rows(baseline_s):
        return [{**_row("sockeye", kv, 10.0, s, repeat), "pct_of_bound": round(100 / s, 1)}
                for repeat in range(3) for kv, s in (("p3", 1.0 / 0.9), ("dist_sync", baseline_s))]

    _write(tmp_path / "sweeps" / "bandwidth.csv", rows(1.25))
    line = next(x for x in paper_table.paper_table_block(tmp_path).splitlines() if x.startswith("| Sockeye |"))
    assert ("| yes | dist_sync already runs at 80% of this point's bound (compute or the busiest link), so a system "
            "sending its bytes can gain at most +25% over it here; p3kv runs at 90% (results/sweeps/bandwidth.csv) "
            "|") in line, line
    (tmp_path / "sweeps" / "bandwidth.csv").unlink()
    _write(tmp_path / "sweeps" / "bandwidth.csv", rows(2.0))
    line = next(x for x in paper_table.paper_table_block(tmp_path).splitlines() if x.startswith("| Sockeye |"))
    assert line.endswith("| yes | not yet measured |"), line


def test_a_gain_above_the_papers_is_explained_only_where_no_system_is_held_by_its_cpu_or_lost_packets(tmp_path):
    """InceptionV3 at +30% (the paper: +18%), faithful runs with the monitors' columns: no host throttled beyond
    0.8% of the window, no drops. The table says so, with each system's share of the bound and the busiest thread;
    a run flagged CPU-bound (or one with drops) leaves the gap "not yet measured"."""
    threads = '{"server":[["python",21.0,0.5,"epoll"]],"worker":[["python",19.0,0.4,"epoll"]]}'

    def rows(notes="", drops=0):
        return [{**_row("inceptionv3", kv, 4.0, s, repeat), "pct_of_bound": pct, "throttled_max_pct": 0.8,
                 "qdisc_drops_total": drops, "thread_cpu": threads,
                 "fidelity_notes": notes if kv == "dist_sync" else ""}
                for repeat in range(3) for kv, s, pct in (("p3", 1.0, 93.0), ("dist_sync", 1.3, 72.0))]

    def line():
        return next(x for x in paper_table.paper_table_block(tmp_path).splitlines() if x.startswith("| InceptionV3 |"))

    path = tmp_path / "sweeps" / "bandwidth.csv"
    _write(path, rows())
    assert ("| +12 | yes | neither system is held here by its CPU (hosts throttled at most 0.8% of the timed window, "
            "no thread above 21% of one dilated CPU) or by lost packets (no queue drops): dist_sync keeps the point's "
            "bottleneck (its busiest link or compute) busy 72% of each iteration, p3kv 93%, and the gain is that "
            "difference; the paper does not say how busy its baseline kept it (results/sweeps/bandwidth.csv) |"
            ) in line(), line()
    for bad in (rows(notes="cpu: flagged CPU-bound, host 0 throttled 7% of the timed window"), rows(drops=12)):
        path.unlink()
        _write(path, bad)
        assert line().endswith("| +12 | yes | not yet measured |"), line()
