"""The simulator's held-out validation: which rows it uses, the fit/held-out split (the fit never sees a held-out
point), the CSV's columns and notes, and the report text generated from them. No simulation of real models."""

import csv
import json

import pytest

from benchmarks.report.sim_blocks import _fit_sentence, sim_validation_block
from benchmarks.sim import link_fit, validate
from benchmarks.sim.cluster import Cluster

pytestmark = pytest.mark.unit

RUN_COLUMNS = ["status", "smoke", "compute", "iter_s", "model", "kvstore", "hosts", "layout", "bandwidth_bps",
               "gpu", "gpu_scale", "efficiency_factor", "slice_size", "batch_size", "optimizer", "samples_per_batch",
               "workers", "unit", "bandwidth", "p100_equiv_gbps", "cpus", "update_on", "cpu_total_pct"]


def run_row(model="resnet50_v1", kvstore="p3", times=(1.0, 1.0), **extra):
    row = {"status": "ok", "smoke": "False", "compute": "emulated", "iter_s": json.dumps(list(times)),
           "model": model, "kvstore": kvstore, "hosts": "4", "layout": "colocated", "bandwidth_bps": "2e9",
           "gpu": "p100", "gpu_scale": "0.2", "efficiency_factor": "1.0", "slice_size": "", "batch_size": "32",
           "optimizer": "sgd", "samples_per_batch": "32", "workers": "4", "unit": "images", "bandwidth": "2gbit",
           "p100_equiv_gbps": "10", "cpus": "2", "update_on": "servers", "cpu_total_pct": "150",
           "priority_hold_ms": "0.5"}  # a p3kv row of the current emulation (superseded.outdated_by)
    row.update(extra)
    return row


def write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)


def test_the_split_fits_on_resnet50_and_vgg19_of_the_bandwidth_sweep_only():
    assert validate.split_of({"source": "sweeps/bandwidth.csv", "model": "vgg19"}) == "fit"
    assert validate.split_of({"source": "sweeps/bandwidth.csv", "model": "resnet50_v1"}) == "fit"
    for source, model in (("sweeps/bandwidth.csv", "inceptionv3"), ("sweeps/bandwidth.csv", "sockeye"),
                          ("sweeps/scale.csv", "vgg19"), ("sweeps/slice.csv", "resnet50_v1"),
                          ("demo_cpu_limited/demo.csv", "resnet50_v1")):
        assert validate.split_of({"source": source, "model": model}) == "held-out"


def test_the_link_fit_never_simulates_a_held_out_point():
    seen = []

    def fake(points, constants):
        seen.extend(points)
        # A model whose bias is (link cost - 3 ns) for p3: the fit must find 3 ns from the fit points alone.
        ns = constants.links.get("p3", 0.0) * 1e9
        return [(p["median_s"] * (1 + 0.01 * (ns - 3.0)), 0.0) for p in points]

    fit = {"split": "fit", "kvstore": "p3", "median_s": 1.0}
    held = {"split": "held-out", "kvstore": "p3", "median_s": 1e9}  # absurd: would wreck a fit that used it
    links = link_fit.fit_links([fit, held, dict(fit, kvstore="p3-slicing-only")], loopback=None, simulate_many=fake)
    assert seen and all(p["split"] == "fit" for p in seen)
    assert links["p3"] == pytest.approx(3e-9, abs=0.2e-9)
    assert links["horovod"] == 0.0  # no fit point of its own: nothing fitted


def test_the_link_fit_uses_cpu_where_the_time_does_not_depend_on_the_cost():
    # Horovod's fit point: s/iter within 1% without the links' cost, flat until CPU runs out at 12 ns/byte, then a
    # cliff; the simulated CPU grows with the cost (20% + 8 points per ns). The time fit would land on the cliff;
    # the measured 36% of CPU says 2 ns/byte.
    def fake(points, constants):
        ns = constants.links.get("horovod", 0.0) * 1e9
        return [(p["median_s"] * (0.995 if ns < 12 else 1.11), 20.0 + 8.0 * ns) for p in points]

    fit = {"split": "fit", "kvstore": "horovod", "median_s": 3.5, "cpu_total_pct": 36.0}
    links = link_fit.fit_links([fit], loopback=None, simulate_many=fake)
    assert links["horovod"] == pytest.approx(2e-9, abs=0.1e-9)
    # Without a measured CPU the time fit stands, as before.
    assert link_fit.fit_links([{**fit, "cpu_total_pct": 0.0}], loopback=None, simulate_many=fake)["horovod"] > 10e-9


def test_p3kvs_links_are_fitted_on_cpu_use_and_ps_lites_on_time():
    # p3kv's threads are the model's (one per connection): its links' CPU is what makes the simulated CPU use the
    # measured one (30% + 10 points per ns: 4 ns), whatever the time says. dist_sync's one modelled receive thread
    # stands for several real ones: its fit stays on s/iter (bias = cost - 3 ns).
    def fake(points, constants):
        out = []
        for p in points:
            ns = constants.links.get(p["kvstore"], 0.0) * 1e9
            out.append((p["median_s"] * (1 + 0.01 * (ns - 3.0)), 30.0 + 10.0 * ns))
        return out

    assert link_fit.own_threads("p3") and not link_fit.own_threads("dist_sync")
    assert not link_fit.own_threads("mxnet-p3") and not link_fit.own_threads("horovod")
    points = [{"split": "fit", "kvstore": kv, "median_s": 2.0, "cpu_total_pct": 70.0} for kv in ("p3", "dist_sync")]
    links = link_fit.fit_links(points, loopback=None, simulate_many=fake)
    assert links["p3"] == pytest.approx(4e-9, abs=0.1e-9)
    assert links["dist_sync"] == pytest.approx(3e-9, abs=0.2e-9)


def test_the_links_delivered_share_is_fitted_on_the_fit_points_alone():
    seen = []

    def fake(points, constants):
        seen.extend(points)
        # A model 2% too fast at the full rate, whatever the system: the fit must find 98% of the rate.
        return [(p["median_s"] * 0.98 / constants.link_efficiency, 0.0) for p in points]

    fit = [{"split": "fit", "kvstore": kv, "median_s": 3.0} for kv in ("p3", "dist_sync", "horovod", "mxnet-p3")]
    held = {"split": "held-out", "kvstore": "p3", "median_s": 1e9}  # absurd: would wreck a fit that used it
    found = link_fit.fit_link_efficiency([*fit, held], loopback=None, links={}, simulate_many=fake)
    assert seen and all(p["split"] == "fit" for p in seen)
    assert found == pytest.approx(0.98, abs=0.0025)  # fitting.root stops within 0.2% of log error
    # A model already too slow at the full rate keeps it (the share never exceeds 1); no fit point: 1.
    slow = link_fit.fit_link_efficiency(fit, None, {}, lambda ps, c: [(p["median_s"] * 1.05, 0.0) for p in ps])
    assert slow == 1.0
    assert link_fit.fit_link_efficiency([held], None, {}, simulate_many=fake) == 1.0


def test_a_links_delivered_share_stretches_its_wire_time_and_is_a_share():
    full, loaded = Cluster(4, 1e9), Cluster(4, 1e9, link_efficiency=0.98)
    assert loaded.seconds_on_wire(1e6) == pytest.approx(full.seconds_on_wire(1e6) / 0.98)
    assert Cluster(4, None, link_efficiency=0.5).seconds_on_wire(1e6) == 0.0  # an uncapped link stays free
    for bad in (0.0, 1.2):
        with pytest.raises(ValueError, match="link_efficiency"):
            Cluster(4, 1e9, link_efficiency=bad)


def test_the_fit_sentence_names_the_links_delivered_share(tmp_path):
    fit = {"fit_points": 8, "links_s_per_byte": {"p3": 0.2e-9}, "thread_costs": {}}
    (tmp_path / "sim_fit.json").write_text(json.dumps(fit))
    assert "delivered" not in _fit_sentence(tmp_path)  # a fit from before the share: nothing claimed
    (tmp_path / "sim_fit.json").write_text(json.dumps({**fit, "link_efficiency": 0.9823}))
    assert "their TCP flows deliver while messages wait, one for every system: 98.23%" in _fit_sentence(tmp_path)


def test_the_fit_is_kept_until_a_fit_point_changes():
    """sim_fit.json's hash covers the fit points as the fit reads them: a rerun of a held-out point (which changes
    every point's `selection` count) keeps the fit; a fit point's new measurement does not."""
    fit = {"split": "fit", "kvstore": "p3", "median_s": 3.15, "selection": "faithful rows only (30 ... left out)"}
    held = {"split": "held-out", "kvstore": "p3", "median_s": 6.3, "selection": fit["selection"]}
    key = validate._inputs_hash([fit, held])
    recount = "faithful rows only (45 from before a change to the emulation left out)"
    assert validate._inputs_hash([{**fit, "selection": recount}, {**held, "selection": recount, "median_s": 6.0}]) \
        == key
    assert validate._inputs_hash([{**fit, "median_s": 3.1}, held]) != key


def test_faithful_rows_are_used_alone_when_there_are_any(tmp_path):
    write(tmp_path / "sweeps" / "bandwidth.csv", [run_row(), run_row(model="vgg19")])
    points, selection = validate.measured_points(tmp_path)
    assert selection == validate.NO_FAITHFUL and len(points) == 2
    assert {p["fidelity"] for p in points} == {validate.UNJUDGED}
    write(tmp_path / "demo_cpu_limited" / "demo.csv",
          [run_row(faithful="False", cpu_quota_cores="0.4"), run_row(faithful="True", cpu_quota_cores="0.4",
                                                                      times=(2.0, 2.0))])
    points, selection = validate.measured_points(tmp_path)
    assert selection == validate.ONLY_FAITHFUL
    assert [(p["fidelity"], p["median_s"], p["split"]) for p in points] == [(validate.FAITHFUL, 2.0, "held-out")]
    assert validate.cluster_of(points[0]).cores == pytest.approx(0.4)  # each host's quota, not a shared machine
    assert validate.cluster_of(points[0]).shared_cores is None


def test_rows_from_before_a_change_to_the_emulation_are_left_out_and_counted(tmp_path):
    current = dict(faithful="True", kvstore="ddp", gradient_work="virtual GPU", update_on="workers")
    write(tmp_path / "sweeps" / "torch.csv", [run_row(**current, times=(2.0, 2.0)),
                                             run_row(**{**current, "gradient_work": ""}),  # its host made the passes
                                             run_row(**{**current, "gradient_work": "", "model": "vgg19"})])
    points, selection = validate.measured_points(tmp_path)
    assert selection == f"{validate.ONLY_FAITHFUL} (2 from before a change to the emulation left out)"
    assert [(p["model"], p["median_s"], p["gradient_work"]) for p in points] == [("resnet50_v1", 2.0, "virtual GPU")]


def test_rows_pool_every_ranks_iterations_and_measure_their_spread(tmp_path):
    write(tmp_path / "sweeps" / "scale.csv",
          [run_row(times=(9.0,), rank_iter_s=json.dumps([[1.0, 1.0], [1.0, 1.0]])),
           run_row(times=(9.0,), rank_iter_s=json.dumps([[1.5, 1.5], [1.5, 1.5]]))])
    points, _ = validate.measured_points(tmp_path)
    assert len(points) == 1 and points[0]["runs"] == 2
    assert points[0]["median_s"] == pytest.approx(1.25) and points[0]["run_spread"] == pytest.approx(0.5)


def test_runs_of_one_setting_under_two_labels_are_one_point_and_other_settings_are_not(tmp_path):
    """A baseline's runs at its defaults before its grid ran ("default (untuned)") and after the grid kept them
    ("default (tuned: ...)") run the same thing: one point of both runs. A setting that differs is another point."""
    untuned = run_row(baseline_setting="default (untuned)", rank_iter_s=json.dumps([[1.0, 1.0], [1.0, 1.0]]))
    kept = run_row(baseline_setting="default (tuned: MXNET_KVSTORE_BIGARRAY_BOUND=1000000)",
                   rank_iter_s=json.dumps([[1.2, 1.2], [1.2, 1.2]]))
    other = run_row(baseline_setting="MXNET_KVSTORE_BIGARRAY_BOUND=100000 (tuned)")
    write(tmp_path / "sweeps" / "dilation.csv", [untuned, kept, other])
    points, _ = validate.measured_points(tmp_path)
    assert sorted(p["runs"] for p in points) == [1, 2]
    pooled = next(p for p in points if p["runs"] == 2)
    assert pooled["baseline_setting"] == "default (untuned)"  # shown as its first run recorded it
    assert pooled["median_s"] == pytest.approx(1.1)


def test_the_csv_has_its_columns_and_a_measured_note_for_every_miss(tmp_path):
    write(tmp_path / "sweeps" / "bandwidth.csv", [run_row(), run_row(model="inceptionv3", cpu_total_pct="190")])
    points, _ = validate.measured_points(tmp_path)
    rows = validate.rows_of(points, [(1.02, 140.0) if p["model"] == "resnet50_v1" else (0.7, 120.0) for p in points])
    assert all(list(r) == list(validate.COLUMNS) for r in rows)
    by_model = {r["model"]: r for r in rows}
    assert by_model["resnet50_v1"]["split"] == "fit" and by_model["resnet50_v1"]["note"] == ""
    miss = by_model["inceptionv3"]
    assert miss["split"] == "held-out" and miss["rel_error"] == pytest.approx(-0.3)
    assert "190% CPU" in miss["note"] and "120%" in miss["note"]
    assert miss["fidelity"] == validate.UNJUDGED and "predating" in miss["selection"]
    assert miss["cpu"] == "shared 2 cores" and miss["vgpu"] == "1 ms forgiven"


def test_measured_cpu_is_the_window_mean_where_every_run_has_one(tmp_path):
    # A bursty job: its median 1-s interval reads the idle seconds, its window's mean the CPU it used.
    bursty = [run_row(model="vgg19", cpu_total_pct="30.0", cpu_total_mean_pct=mean)  # made-up numbers
              for mean in ("72.0", "76.0", "74.0")]
    older = [run_row(model="inceptionv3", cpu_total_pct=pct, cpu_total_mean_pct=mean)
             for pct, mean in (("150", "160"), ("140", ""))]  # one run from before the mean: the median for all
    write(tmp_path / "sweeps" / "torch.csv", bursty + older)
    points = {p["model"]: p for p in validate.measured_points(tmp_path)[0]}
    assert points["vgg19"]["cpu_total_pct"] == 74.0
    assert points["vgg19"]["cpu_statistic"] == validate.CPU_MEAN
    assert points["inceptionv3"]["cpu_total_pct"] == 145.0
    assert points["inceptionv3"]["cpu_statistic"] == validate.CPU_MEDIAN_INTERVAL
    rows = {r["model"]: r for r in validate.rows_of(list(points.values()), [(0.7, 30.0), (0.7, 30.0)])}
    assert "74% CPU, the model 30%" in rows["vgg19"]["note"]  # the mean: said without a qualifier
    assert f"145% CPU ({validate.CPU_MEDIAN_INTERVAL})" in rows["inceptionv3"]["note"]


def test_a_miss_without_a_measured_cause_says_so():
    point = {"run_spread": 0.0, "cpu_total_pct": 100.0, "tcp_retrans": 0.0, "throttled_pct": 0.0,
             "vgpu_late_us": 0.0}
    assert validate.note(point, 0.2, 100.0) == "no measured cause found"
    assert validate.note(point, 0.05, 100.0) == ""
    loss = dict(point, tcp_retrans=1200.0, throttled_pct=30.0)
    assert "1200 TCP retransmits" in validate.note(loss, -0.2, 100.0)
    assert "throttled 30%" in validate.note(loss, -0.2, 100.0)
    # A torch run from before gradient_work.py: its hosts made the gradient passes, which the model leaves out.
    old_ddp = dict(point, kvstore="ddp", gradient_work="")
    assert "gradient passes" in validate.note(old_ddp, -0.2, 100.0)
    assert validate.note(dict(old_ddp, gradient_work="virtual GPU"), -0.2, 100.0) == "no measured cause found"


def test_the_report_text_comes_from_the_csv(tmp_path):
    rows = [{**{c: "" for c in validate.COLUMNS}, "source": "sweeps/bandwidth.csv", "split": split,
             "fidelity": validate.UNJUDGED, "selection": validate.NO_FAITHFUL, "model": model, "kvstore": "p3",
             "hosts": "4", "bandwidth": "2gbit", "rel_error": str(error), "note": note}
            for split, model, error, note in (("fit", "vgg19", 0.01, ""), ("held-out", "sockeye", -0.2,
                                                                          "no measured cause found"),
                                              ("held-out", "inceptionv3", 0.02, ""))]
    write(tmp_path / "sim_validation.csv", rows)
    text = sim_validation_block(tmp_path)
    assert "| fit | p3kv | 1 | 1 | +1.0% |" in text
    assert "| held-out | p3kv | 2 | 1 | -9.0% |" in text
    assert "1 of 2 points (50.0%) within 10%" in text and "is not met" in text
    assert "predate the faithful emulation" in text
    assert "none of these was measured at 1" in text
