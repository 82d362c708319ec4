"""The environment a benchmark job's processes start with, the same for every runner (kvstore_bench, cluster_job).

Horovod's ranks get no parameter-server variables (P3_*, DMLC_*): a value left in the caller's shell must not
change what the baseline runs. A slice size reaches both slicing systems, p3kv (P3_SLICE_SIZE) and MXNet's P3
(MXNET_KVSTORE_SLICE_THRESHOLD, cut on the worker side), so they compare at the same message size.
"""

from __future__ import annotations

import os

from benchmarks.paths import ROOT


def job_environment(system: str, slice_size: int | None = None, paths: tuple[str, ...] = (),
                    base: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of `base` (os.environ) for a job of `system` ("horovod" or a parameter-server system), with the
    repository and `paths` first on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    if system == "horovod":
        env = {k: v for k, v in env.items() if not k.startswith(("P3_", "DMLC_"))}
    elif slice_size:
        env["P3_SLICE_SIZE"] = env["MXNET_KVSTORE_SLICE_THRESHOLD"] = str(slice_size)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), *paths, env.get("PYTHONPATH", "")) if p)
    return env
