"""What every benchmark worker reports beside its timings: the versions that ran, and its result line."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import pathlib
import platform


def versions(*packages: str, p3kv_path: bool = False) -> dict:
    """Python's version and each installed package's (None when missing), read from package metadata so that a
    worker that never imports mxnet does not have to. `p3kv_path`: also which checkout runs (an editable
    install may point elsewhere than the one being measured)."""
    found: dict = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    if p3kv_path:
        spec = importlib.util.find_spec("p3kv")
        found["p3kv_path"] = str(pathlib.Path(spec.origin).parent) if spec and spec.origin else None
    return found


def append_line(path: pathlib.Path, row: dict) -> None:
    """Appends `row` as one JSON line to `path` (creating its folder): the runner reads the last line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
