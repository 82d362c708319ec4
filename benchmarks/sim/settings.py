"""Each system's own settings in a simulation: what a measured row ran (its baseline_setting column), else the
tuned best for the model (results/tuning/best.json, `python -m benchmarks tune`), else the defaults read in
each project's source (benchmarks/suites/baseline_settings.py: Horovod 0.28.1's 128 MiB / 1 ms fusion, MXNet's
10^6-element big-array bound and 40,000-element P3 slices, p3kv's 50,000-element slices)."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping

from benchmarks.sim import ddp, ps, ring
from benchmarks.sim.ps import PSSystem
from benchmarks.suites import baseline_settings

DEFAULTS = baseline_settings.DEFAULTS
OWNER = {"p3-slicing-only": "p3", "p3-priority-only": "p3", "p3-priority-split": "p3"}  # ablations: p3kv's


def parse_label(label: str) -> dict[str, str]:
    """"VAR=VALUE VAR=VALUE (tuned)" -> {VAR: VALUE}; a label of the defaults (or none) -> {}."""
    if not label or baseline_settings.identity(label) == "default":
        return {}
    return dict(part.split("=", 1) for part in label.split(" (")[0].split() if "=" in part)


def tuned_for_model(system: str, model: str, best: Mapping | None = None,
                    path: pathlib.Path | None = baseline_settings.BEST) -> tuple[dict[str, str], str]:
    """(variables, where from) of `system`'s tuned best at a point of `model` in best.json (the first such point
    in key order, smoke entries skipped), or ({}, "default") where none was tuned."""
    best = baseline_settings.load_best(path) if best is None else best
    for key in sorted(best):
        entry = best[key].get(system)
        if key.split(".")[0] == model and entry and not entry.get("smoke"):
            return dict(entry["setting"]), f"tuned at {key}"
    return {}, "default"


def setting(system: str, chosen: Mapping[str, str] | None = None) -> dict[str, str]:
    """The system's variables: its defaults overridden by `chosen`."""
    return {**DEFAULTS.get(OWNER.get(system, system), {}), **(chosen or {})}


def apply_ps(system: PSSystem, env: Mapping[str, str], slice_size: int | None = None) -> PSSystem:
    """A parameter-server system with its variables applied; a point's own slice size wins (as
    job_env.job_environment gives it to both slicing systems)."""
    changes: dict = {}
    if system.name == "dist_sync" and "MXNET_KVSTORE_BIGARRAY_BOUND" in env:
        changes["big_array_bound"] = int(env["MXNET_KVSTORE_BIGARRAY_BOUND"])
    if system.name == "mxnet-p3" and "MXNET_KVSTORE_SLICE_THRESHOLD" in env:
        changes["slice_size"] = int(env["MXNET_KVSTORE_SLICE_THRESHOLD"])
    if system.slice_size and system.name in ("p3", "p3-slicing-only") and "P3_SLICE_SIZE" in env:
        changes["slice_size"] = int(env["P3_SLICE_SIZE"])
    if system.socket_bytes and system.name != "mxnet-p3" and "P3_SOCKET_BUFFER" in env:
        changes["socket_bytes"] = ps.socket_payload(float(env["P3_SOCKET_BUFFER"]))
    if slice_size and system.slice_size:
        changes["slice_size"] = slice_size
    if system.name == "mxnet-p3" and "slice_size" in changes:  # its ZMQ pipe holds messages, not bytes
        changes["socket_bytes"] = ps.mxnet_p3_socket(changes["slice_size"])
    return dataclasses.replace(system, **changes)


def apply_horovod(horovod: ring.Horovod, env: Mapping[str, str]) -> ring.Horovod:
    changes: dict = {}
    if "HOROVOD_FUSION_THRESHOLD" in env:
        changes["fusion_bytes"] = int(env["HOROVOD_FUSION_THRESHOLD"])
    if "HOROVOD_CYCLE_TIME" in env:
        changes["cycle_s"] = float(env["HOROVOD_CYCLE_TIME"]) / 1000
    return dataclasses.replace(horovod, **changes)


def apply_ddp(d: ddp.Ddp, env: Mapping[str, str]) -> ddp.Ddp:
    """DDP_BUCKET_CAP_MB (the benchmark worker's bucket_cap_mb; 25 stands for DDP's default, the first bucket
    1 MiB; another value makes every bucket that size, as DDP does when bucket_cap_mb is given)."""
    cap = float(env.get("DDP_BUCKET_CAP_MB", DEFAULTS["ddp"]["DDP_BUCKET_CAP_MB"]))
    if cap == float(DEFAULTS["ddp"]["DDP_BUCKET_CAP_MB"]):
        return d
    return dataclasses.replace(d, bucket_bytes=int(cap * ddp.MIB), first_bucket_bytes=int(cap * ddp.MIB))
