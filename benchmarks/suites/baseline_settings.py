"""Each system's own settings in the comparisons: the variables it is tuned by, their defaults as read in the
source of the versions the benchmarks run, and the best setting per point that `python -m benchmarks tune`
found (results/tuning/best.json), which the comparison suites (cluster_bench, sweeps, demo) apply: a point's own
entry, else the entry of the same P100-equivalent comparison tuned at another dilation (the dilation sweep).

The defaults, read in the source (not assumed):
- Horovod 0.28.1 (tag v0.28.1, commit 1d217b5), horovod/common/operations.cc, InitializeHorovodOnce: the tensor
  fusion threshold is set to 128 MiB (`SetTensorFusionThresholdBytes(128 * 1024 * 1024)`) and the cycle time to
  1 ms (`SetCycleTimeMs(1)`) before HOROVOD_FUSION_THRESHOLD (bytes) and HOROVOD_CYCLE_TIME (ms) override them.
  Older Horovod had 64 MiB / 5 ms, which is what the bound and the simulator assumed.
- MXNet 1.9 (apache/incubator-mxnet, branch v1.x): src/kvstore/kvstore_dist.h reads MXNET_KVSTORE_BIGARRAY_BOUND
  with default 1000 * 1000 elements (arrays at or above it are split over every server); src/kvstore/
  p3store_dist.h (MXNet's P3, `DMLC_PS_VAN_TYPE=p3`) reads MXNET_KVSTORE_SLICE_THRESHOLD with default 40 * 1000
  elements per slice. The installed libmxnet.so holds both variable names.
- p3kv: p3kv/core/config.py (P3_SLICE_SIZE 50,000 elements, P3_SOCKET_BUFFER 131,072 bytes).
- PyTorch DDP 2.13.0 (the installed torch/nn/parallel/distributed.py): bucket_cap_mb None means 25 MiB
  (_DEFAULT_BUCKET_CAP_MB) with the first bucket capped at 1 MiB (_DEFAULT_FIRST_BUCKET_BYTES); torch has no
  variable for it, so the benchmark's DDP worker reads DDP_BUCKET_CAP_MB (benchmarks/workloads/torch_worker.py:
  25 stands for DDP's default, first bucket included).

A setting reaches every process of a job through the environment: cluster_job.py adds it to the job's
environment, the launcher hands its environment on (Horovod's ranks lose only P3_* and DMLC_* variables,
p3kv.launch.horovod; ps-lite's scheduler, servers and workers keep everything, p3kv.launch.baselines).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import pathlib
from collections.abc import Mapping, Sequence

from benchmarks.analysis.points import DEFAULT_UNTUNED as DEFAULT_UNTUNED  # re-exported: the suites' name
from benchmarks.analysis.points import DEFAULTS as DEFAULTS  # re-exported: every tuned variable's default
from benchmarks.analysis.points import MIB as MIB  # re-exported: sim/ddp.py reads it here
from benchmarks.analysis.points import setting_identity
from benchmarks.emulation.link_shaping import parse_rate
from benchmarks.paths import RESULTS
from p3kv.core import config

LOG = logging.getLogger("baseline_settings")
identity = setting_identity  # a row's label and its identity live with the rows (superseded.py reads them too)
TUNING = RESULTS / "tuning"
BEST = TUNING / "best.json"
# Where a point fixes the slice size itself (the slice sweep), a tuned slice size must not override it.
SLICE_VARIABLES = ("P3_SLICE_SIZE", "MXNET_KVSTORE_SLICE_THRESHOLD")


def horovod_cycle_real_ms(setting_env: Sequence[tuple[str, str]], dilation: float) -> float:
    """Horovod's cycle time in real ms: its background thread wakes and negotiates with every rank once per cycle
    even when idle, a timer like the links' and the CPU quota's, so the setting (default or tuned) is read in the
    GPU's own time and dilated like them. Rounded so that a row's text reads back as the same number (--resume)."""
    cycle = dict(setting_env).get("HOROVOD_CYCLE_TIME", DEFAULTS["horovod"]["HOROVOD_CYCLE_TIME"])
    return round(float(cycle) / dilation, 6)


def priority_hold_ms(env: Mapping[str, str]) -> float:
    """The P3_PRIORITY_HOLD_MS a p3kv job's environment gives its nodes (the rows' priority_hold_ms)."""
    return float(config.get("P3_PRIORITY_HOLD_MS", env))


def env_text(env: Mapping[str, str]) -> str:
    """"A=1 B=2": a setting as the rows and best.json show it."""
    return " ".join(f"{k}={v}" for k, v in env.items())


def _extras(point) -> list[str]:
    """What differs from the suites' defaults, in a point key's text."""
    extras = [(point.batch_size != 32, f"b{point.batch_size}"), (point.optimizer != "sgd", point.optimizer),
              (point.layout != "colocated", point.layout),
              (point.efficiency_factor != 1.0, f"e{point.efficiency_factor:g}"),
              (point.tcp_congestion is not None, f"tcp-{point.tcp_congestion}")]
    return [text for differs, text in extras if differs]


def point_key(point) -> str:
    """The name of a comparison point (a cluster_job.Point, any system): model, link, hosts, dilation, compute,
    and what else differs from the suites' defaults. best.json and the tuning CSVs are keyed by it."""
    key = f"{point.model}.{point.bandwidth or 'uncapped'}.{point.hosts}h.x{point.gpu_scale:g}.{point.compute}"
    return ".".join([key, *_extras(point)])


def comparison_key(point) -> str | None:
    """The comparison a point emulates, at any dilation: its key with the link as the P100-equivalent rate (a link
    of rate b at --gpu-scale s emulates links of b / s) and no dilation; None for an uncapped link. tune writes it
    into every best.json entry, so that one dilation's best setting serves the same comparison at the others."""
    if not point.bandwidth:
        return None
    mbit = round(parse_rate(point.bandwidth) / point.gpu_scale / 1e6, 1)
    return ".".join([f"{point.model}.{mbit:g}mbit-p100.{point.hosts}h.{point.compute}", *_extras(point)])


def load_best(path: pathlib.Path | None = BEST) -> dict:
    """{point key: {system: entry}} from best.json; {} when there is none."""
    if path is None or not path.exists():
        return {}
    return json.loads(path.read_text())


def _entry(point, best: Mapping) -> tuple[dict | None, float | None]:
    """The best.json entry of `point`'s system: its own point's, else the same comparison's tuned at another
    dilation (the least dilated one), with that dilation; (None, None) when there is neither. A point under a
    TCP congestion control of its own (tcp_congestion) without an entry of its own falls back to the machine's."""
    entry, scale = _own_entry(point, best)
    if entry is None and point.tcp_congestion is not None:
        return _own_entry(dataclasses.replace(point, tcp_congestion=None), best)
    return entry, scale


def _own_entry(point, best: Mapping) -> tuple[dict | None, float | None]:
    entry = best.get(point_key(point), {}).get(point.kvstore)
    if entry is not None:
        return entry, None
    mine = comparison_key(point)
    found = [(float(e["gpu_scale"]), e) for systems in best.values() if (e := systems.get(point.kvstore))
             and mine is not None and e.get("comparison") == mine]
    if not found:
        return None, None
    scale, entry = max(found, key=lambda f: f[0])
    return entry, scale


def tuned(point, best: Mapping) -> tuple[tuple[tuple[str, str], ...], str] | None:
    """(environment, label) of `point`'s system at its tuned best, or None (no entry: the default, untuned). A
    point tuned only at another dilation (the dilation sweep) runs that setting, and its label says where it
    was tuned ("(tuned at x0.11)")."""
    entry, elsewhere = _entry(point, best)
    if entry is None:
        return None
    if entry.get("smoke"):
        LOG.warning("%s at %s: best.json's entry comes from a smoke run; ignored", point.kvstore, point_key(point))
        return None
    env = dict(entry["setting"])
    label = entry["label"]
    if elsewhere is not None:
        label = label.replace("(tuned", f"(tuned at x{elsewhere:g}", 1)
    if point.slice_size:
        kept = {k: v for k, v in env.items() if k not in SLICE_VARIABLES}
        if kept != env:
            env, label = kept, f"{env_text(kept) or 'default'} (tuned; the point's slice size)"
    return tuple(env.items()), label


def at_best(points: Sequence, best_path: pathlib.Path | None = BEST) -> list:
    """The points with each tuned system at its best setting for that point (best.json), the others unchanged
    (their rows say "default (untuned)"). A point that already carries a setting (a tuning cell) keeps it."""
    best = load_best(best_path)
    out = []
    for p in points:
        found = tuned(p, best) if p.kvstore in DEFAULTS and not p.setting_env else None
        out.append(dataclasses.replace(p, setting_env=found[0], baseline_setting=found[1]) if found else p)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--best", type=pathlib.Path, default=BEST, help="each system's best setting per point "
                        "(python -m benchmarks tune writes it); a point without an entry runs the defaults, and "
                        "its rows say 'default (untuned)'")
    parser.add_argument("--untuned", action="store_true", help="run every system at its defaults, whatever "
                        "--best holds")


def from_args(points: Sequence, args: argparse.Namespace) -> list:
    """at_best with add_arguments' options (a namespace without them: best.json at its usual place)."""
    return list(points) if getattr(args, "untuned", False) else at_best(points, getattr(args, "best", BEST))
