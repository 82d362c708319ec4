"""Nanoseconds per element of each native optimizer kernel on one 50,000-element slice (the paper's slice
size), single thread. Writes benchmarks/results/kernels.md.

Usage: python -m benchmarks.suites.kernel_bench [--repeats N]
"""

import argparse
import time

import numpy as np

from benchmarks.paths import RESULTS
from p3kv import _p3

SLICE = 50_000
CASES = [
    ("sgd", {"kind": "sgd"}),
    ("sgd momentum=0.9", {"kind": "sgd", "momentum": 0.9}),
    ("nag momentum=0.9", {"kind": "nag", "momentum": 0.9}),
    ("adam", {"kind": "adam"}),
    ("rmsprop", {"kind": "rmsprop"}),
    ("rmsprop centered", {"kind": "rmsprop", "centered": True, "clip_weights": 1.0}),
    ("adagrad", {"kind": "adagrad"}),
    ("adadelta", {"kind": "adadelta"}),
    ("adamax", {"kind": "adamax"}),
    ("signum", {"kind": "signum", "momentum": 0.9}),
    ("signsgd", {"kind": "signum", "momentum": 0.0}),
    ("ftrl", {"kind": "ftrl"}),
    ("ftml", {"kind": "ftml"}),
]
DTYPES = [("float32", False), ("float16", True), ("float16", False)]


def time_kernel(spec, dtype, repeats):
    rng = np.random.default_rng(0)
    w = rng.standard_normal(SLICE).astype(dtype)
    g = (rng.standard_normal(SLICE) * 1e-2).astype(dtype)
    n = _p3.num_states(spec, dtype)
    state_dtype = np.float32 if spec.get("multi_precision") or dtype == "float32" else dtype
    states = [np.zeros(SLICE, state_dtype) for _ in range(n)]
    _p3.init_states(spec, dtype, w, states)
    step = (1e-3, 1e-4, 1.0, 5.0, 1.0)
    _p3.apply_update(spec, step, dtype, w, g, states)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        _p3.apply_update(spec, step, dtype, w, g, states)
        best = min(best, time.perf_counter() - t0)
    return best * 1e9 / SLICE


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", default=str(RESULTS / "kernels.md"))
    args = ap.parse_args()
    cols = [f"{d}{' mp' if mp else ''}" for d, mp in DTYPES]
    rows = []
    for name, spec in CASES:
        cells = []
        for dtype, mp in DTYPES:
            s = dict(spec, multi_precision=mp)
            try:
                cells.append(f"{time_kernel(s, dtype, args.repeats):.2f}")
            except ValueError:
                cells.append("n/a")  # MXNet itself cannot update these weights with this optimizer
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    text = (f"# Optimizer kernel speed\n\nns per element, one {SLICE}-element slice, one thread, best of "
            f"{args.repeats} (benchmarks/suites/kernel_bench.py; includes the Python call, about 1 us per slice). "
            "n/a: MXNet keeps float32 state for this optimizer and cannot update plain float16 weights.\n\n"
            "| kernel | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols) + "\n" + "\n".join(rows) + "\n")
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
