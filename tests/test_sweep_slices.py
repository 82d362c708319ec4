"""Long sweeps in slices that fit an idle window (benchmarks/suites/sweep_slices.py, `sweeps.py --slice K/N`,
`sweeps.py estimate --window H`): slices are whole rounds (every system of a point once), comparison by comparison,
cover the sweep exactly once, keep their interleaved order, are the same in every invocation, split a comparison
only where a part boundary falls (so one longer than the window spreads over several slices), and the estimate
says how many fit the window."""

import pytest

from benchmarks.suites import sweep_slices, sweeps

pytestmark = pytest.mark.unit


def _seconds(points):
    return 60.0 * sum(p.iters for p in points)


def test_parse_names_the_slice_or_the_problem():
    assert sweep_slices.parse("2/5") == (2, 5)
    for bad in ("0/3", "4/3", "2", "a/b", "1/0"):
        with pytest.raises(ValueError, match="K/N"):
            sweep_slices.parse(bad)
    with pytest.raises(SystemExit):
        sweeps.parse_args(["bandwidth", "--slice", "3/2"])


def test_slices_are_whole_rounds_that_cover_the_sweep_once():
    args = sweeps.parse_args(["bandwidth"])
    points = sweeps.sweep_points("bandwidth", args)
    assert len(points) == 4 * 6 * 4 * 3  # models x points x systems x repeats
    parts = [sweep_slices.select(points, k, 5, _seconds) for k in range(1, 6)]
    assert sorted(map(id, [p for part in parts for p in part])) == sorted(map(id, points))  # each run once
    split = 0
    for part in parts:
        assert part and part == [p for p in points if p in part]  # the interleaved order is kept
        for p in part:  # every system of a round is in the same slice
            assert all(q in part for q in points if q.group() == p.group() and q.repeat == p.repeat)
        split += len({p.group() for p in part} - {p.group() for p in part
                                                   if all(q in part for q in points if q.group() == p.group())})
    assert split <= 2 * (5 - 1)  # a comparison is split only at a boundary (counted once on each side)
    costs = [_seconds(part) for part in parts]
    assert max(costs) <= 1.5 * sum(costs) / 5  # about equal
    again = sweeps.sweep_points("bandwidth", sweeps.parse_args(["bandwidth", "--resume"]))
    assert ([(p.group(), p.repeat) for p in sweep_slices.select(again, 2, 5, _seconds)]
            == [(p.group(), p.repeat) for p in parts[1]])


def test_a_comparison_longer_than_the_window_spreads_over_slices_round_by_round():
    points = sweeps.sweep_points("bandwidth", sweeps.parse_args(["bandwidth", "--models", "vgg19", "resnet50_v1",
                                                                 "--equivalents", "15", "4", "--repeats", "5"]))
    assert sorted(g[0] for g in sweep_slices.by_comparison(points)) == ["resnet50_v1", "vgg19"]  # one point each

    def uneven(members):  # VGG-19's comparison ten times as long as ResNet-50's
        return _seconds(members) * (10 if members[0].model == "vgg19" else 1)

    vgg = sum(uneven([p]) for p in points if p.model == "vgg19")
    n, longest = sweep_slices.slices_for(points, vgg / 2, uneven)
    assert n >= 3 and longest <= vgg / 2  # each part fits the window although the VGG-19 comparison alone does not
    holding = [k for k in range(1, n + 1) if any(p.model == "vgg19" for p in sweep_slices.select(points, k, n, uneven))]
    assert len(holding) >= 2 and holding == list(range(holding[0], holding[-1] + 1))  # consecutive slices
    rounds = [{p.repeat for p in sweep_slices.select(points, k, n, uneven) if p.model == "vgg19"} for k in holding]
    assert sorted(r for part in rounds for r in part) == list(range(5))  # each round in exactly one slice


def test_the_fewest_slices_that_fit_the_window():
    points = sweeps.sweep_points("bandwidth", sweeps.parse_args(["bandwidth"]))
    total = _seconds(points)
    n, longest = sweep_slices.slices_for(points, total / 3.5, _seconds)
    assert n >= 4 and longest <= total / 3.5
    assert sweep_slices.slices_for(points, total * 2, _seconds) == (1, total)
    rounds = sweep_slices.by_round(points)

    def uneven(members):  # VGG-19's rounds three times as long as the others'
        return _seconds(members) * (3 if members[0].model == "vgg19" else 1)

    n, longest = sweep_slices.slices_for(points, 1.0, uneven)  # no round fits the window
    # the fewest slices none longer than the longest round, not one slice per round
    cost = {r: uneven(members) for r, members in rounds.items()}
    assert longest == max(cost.values()) and n < len(rounds)
    assert max(sum(cost[r] for r in part) for part in sweep_slices.parts(points, n - 1, uneven)) > longest
    assert sweep_slices.slices_for([], 1.0, _seconds) == (0, 0.0)


def test_estimate_prints_each_sweeps_slices_for_the_window(tmp_path, capsys):
    assert sweeps.main(["estimate", "--window", "2", "--results-dir", str(tmp_path / "sweeps")]) == 0
    out = capsys.readouterr().out
    assert "Slices of at most 2 h" in out
    plan = {line.split()[0]: line for line in out.splitlines() if " N = " in line}
    assert set(plan) == set(sweeps.ALL)
    rows, _ = sweeps.estimates(sweeps.parse_args(["estimate"]), tmp_path / "sweeps")
    for name, full, _ in rows:  # a sweep longer than the window needs more than one slice
        n = int(plan[name].split("N =")[1].split()[0])
        assert (n > 1) == (full > 2 * 3600) or "longer than the window" in plan[name], plan[name]


def test_the_bandwidth_sweep_runs_only_the_rates_asked_for():
    args = sweeps.parse_args(["bandwidth", "--models", "resnet50_v1", "--equivalents", "4"])
    points = sweeps.SWEEPS["bandwidth"](args)
    assert {(p.model, p.kvstore) for p in points} == {("resnet50_v1", kv) for kv in sweeps.SYSTEMS}
    assert {p.bandwidth for p in points} == {sweeps.link(4, points[0].gpu_scale)}
    with pytest.raises(SystemExit):  # 15 Gbps is VGG-19's point, not ResNet-50's
        sweeps.parse_args(["bandwidth", "--models", "resnet50_v1", "--equivalents", "15"])
