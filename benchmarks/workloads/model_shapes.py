"""A model's description (workloads/shapes/<model>.json, written by make_shapes.py): every parameter array's
shape and dtype in forward order, and, for the emulated compute, each layer's FLOPs and calibration. The one
reader every worker, runner and the simulator use."""

from __future__ import annotations

import json
import pathlib

from benchmarks.paths import SHAPES_DIR

REGENERATE = "python -m benchmarks.workloads.make_shapes --models {model}"


def load(model: str, shapes_dir: pathlib.Path = SHAPES_DIR, layers: bool = False) -> dict:
    """The parsed shape file of `model`; `layers`: it must hold the per-layer profile (emulated compute)."""
    path = pathlib.Path(shapes_dir) / f"{model}.json"
    if not path.exists():  # FileNotFoundError: a model without shapes (the deployment's tiny MLP) has no bound
        raise FileNotFoundError(f"no shape file {path}: generate it with {REGENERATE.format(model=model)}")
    description = json.loads(path.read_text())
    if layers and "layers" not in description:
        raise SystemExit(f"{path} has no per-layer profile (\"layers\"): regenerate it with "
                         f"{REGENERATE.format(model=model)}")
    return description


def array_sizes(model: str, shapes_dir: pathlib.Path = SHAPES_DIR) -> tuple[list[int], int]:
    """(elements of every array, model bytes)."""
    itemsize = {"float32": 4, "float16": 2, "float64": 8}
    sizes, total = [], 0
    for p in load(model, shapes_dir)["params"]:
        n = 1
        for d in p["shape"]:
            n *= d
        sizes.append(n)
        total += n * itemsize.get(p["dtype"], 4)
    return sizes, total
