"""Smoke test of the server hot-path benchmark (benchmarks/suites/server_bench.py): it builds warnings-clean with the
extension's flags and reports positive times and the documented CSV columns, on tiny sizes."""


import pytest

from benchmarks.suites import server_bench

pytestmark = pytest.mark.unit

COLUMNS = {"workers", "count", "optimizer", "states", "slices", "iters", "repeats", "work_cpu_ns_median",
           "work_cpu_ns_min", "work_cpu_ns_max", "work_wall_ns_median", "floor_cpu_ns_median", "floor_cpu_ns_min",
           "floor_cpu_ns_max", "floor_wall_ns_median", "kernel_cpu_ns_median", "ratio_median", "ratio_min",
           "ratio_max", "floor_bytes", "floor_gb_per_s"}


def test_server_bench_builds_and_reports_sane_numbers(tmp_path):
    binary = tmp_path / "server_slice_bench"
    server_bench.build(binary)  # -Werror: a warning fails the build
    comments, rows = server_bench.run(
        binary, ["--workers", "2,3", "--counts", "1000", "--optimizers", "none,sgd,adam", "--elements", "8000",
                 "--iters", "2", "--warmup", "1", "--repeats", "1"], timeout=30)
    assert any(c.startswith("floor = memcpy") for c in comments), comments
    assert len(rows) == 6
    for r in rows:
        assert set(r) == COLUMNS, set(r) ^ COLUMNS
        assert int(r["slices"]) == 8 and int(r["count"]) == 1000
        for col in ("work_cpu_ns_median", "work_wall_ns_median", "floor_cpu_ns_median", "ratio_median",
                    "floor_gb_per_s"):
            assert float(r[col]) > 0, (col, r)
        assert int(r["floor_bytes"]) > 0
        states = {"none": 0, "sgd": 1, "adam": 2}[r["optimizer"]]
        assert int(r["states"]) == states
        assert (float(r["kernel_cpu_ns_median"]) > 0) == (states > 0)
        w, b = int(r["workers"]), 4000
        assert int(r["floor_bytes"]) == w * b + (b if states == 0 else 2 * (1 + states) * b)
