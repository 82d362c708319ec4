"""`fab bench`'s rows (deploy/compare.py) from workers' results, without a cluster: the statistics pool every
rank's iterations as the emulated runner's rows do, and the row says where the update ran and with which of the
system's own settings."""

import pytest

from deploy.compare import _benchmarks, _row

pytestmark = pytest.mark.unit


def _result(rank, times):
    return {"rank": rank, "iter_s": times, "median_s": sorted(times)[len(times) // 2], "compute_s": 0.1,
            "samples_per_batch": 16, "unit": "samples", "optimizer": "sgd(momentum=0.9)", "update_on": "servers",
            "update_placement": "servers (CPU)", "versions": {"mxnet": "1.9.1"}}


def test_a_row_pools_every_ranks_iterations():
    cb = _benchmarks()
    point = cb.Point(model="tiny-mlp", kvstore="p3", hosts=2, bandwidth=None, compute="real", iters=4)
    results = [_result(1, [2.0, 2.0, 2.0, 2.0]), _result(0, [1.0, 1.0, 1.0, 1.0])]
    row = _row(cb, results, point=point, workers=2, servers=2, colocated=True, exit_code=0, wall=9.0,
                       devices={"cpu"}, run_id="x")
    assert row["status"] == "ok"
    assert row["rank_iter_s"] == [[1.0] * 4, [2.0] * 4] and row["iter_s"] == [1.0] * 4
    assert (row["q1_s"], row["median_s"], row["q3_s"]) == (1.0, 1.5, 2.0)  # rank 0 alone would say 1.0
    assert row["update_placement"] == "servers (CPU)"


def test_the_setting_column_names_the_systems_own_variables_only():
    cb = _benchmarks()
    env = {"MXNET_KVSTORE_SLICE_THRESHOLD": "50000", "P3_SLICE_SIZE": "25000", "OMP_NUM_THREADS": "1"}
    assert cb.setting("mxnet-p3", env) == "MXNET_KVSTORE_SLICE_THRESHOLD=50000"
    assert cb.setting("p3", env) == "P3_SLICE_SIZE=25000"
    assert cb.setting("horovod", env) == cb.setting("dist_sync", None) == "default (untuned)"
