"""How evenly a p3kv job's workers send to its servers, from its traces (P3_TRACE=PREFIX on every node: the
files PREFIX.worker<r>.json and PREFIX.server<r>.json, p3kv.core.node.write_trace). Per iteration that every
worker traced completely:

- **drift**: per worker, the time between its last slice to the first server it finished and to the last one
  (0 when it serves every server in one priority order); the median over workers and iterations, and the largest;
- **order breaks**: slices a worker sent after its backward pass ended (its last enqueue) whose priority is
  higher than the slice it sent just before: a more urgent slice that had waited behind a less urgent one;
- **push skew**: per slice at its server, the time from the first worker's push arriving to the last one's (the
  server's broadcast waits for the last), the median over slices and iterations.

    python -m benchmarks.analysis.trace_anatomy PREFIX [PREFIX ...] > table.md
"""

from __future__ import annotations

import glob
import json
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence


def load(path: str) -> list[tuple[float, dict]]:
    """(seconds, args) of every event of one node's trace."""
    with open(path) as f:
        return [(e["ts"] / 1e6, e["args"]) for e in json.load(f)["traceEvents"]]


def _nodes(prefix: str, role: str) -> dict[int, list[tuple[float, dict]]]:
    found = {}
    for path in glob.glob(f"{glob.escape(prefix)}.{role}*.json"):
        m = re.search(rf"\.{role}(\d+)\.json$", path)
        if m:
            found[int(m.group(1))] = load(path)
    return found


def anatomy(workers: dict[int, list], servers: dict[int, list]) -> dict:
    """The three measures over the iterations every worker traced in full (see the module's docstring)."""
    per_iteration: dict[int, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for rank, events in workers.items():
        for t, a in events:
            per_iteration[a["iteration"]][rank].append((t, a))
    def count(evs: list, event: str) -> int:
        return sum(a["event"] == event for _, a in evs)

    # An iteration's slices: the most common count of enqueues per worker and iteration (the ring may have dropped
    # the start of the first one traced, and the last may be cut short).
    per_worker = [count(evs, "enqueue") for by_rank in per_iteration.values() for evs in by_rank.values()]
    slices = statistics.mode(per_worker) if per_worker else 0
    full = sorted(it for it, by_rank in per_iteration.items() if len(by_rank) == len(workers) and all(
        count(evs, "enqueue") == count(evs, "send") == slices for evs in by_rank.values()))
    drifts, breaks, sends = [], 0, 0
    for it in full:
        for evs in per_iteration[it].values():
            backward_end = max(t for t, a in evs if a["event"] == "enqueue")
            out = sorted((t, a["priority"], a["peer"]) for t, a in evs if a["event"] == "send")
            last = {}
            for t, _, server in out:
                last[server] = t
            drifts.append(max(last.values()) - min(last.values()))
            after = [o for o in out if o[0] > backward_end]
            breaks += sum(1 for x, y in zip(after, after[1:]) if y[1] > x[1])
            sends += len(after)
    skews = []
    wanted = set(full)
    for events in servers.values():
        arrivals: dict[tuple, list[float]] = defaultdict(list)
        for t, a in events:
            if a["event"] == "server_receive" and a["iteration"] in wanted:
                arrivals[(a["iteration"], a["key"], a["slice"])].append(t)
        skews += [max(ts) - min(ts) for ts in arrivals.values() if len(ts) == len(workers)]
    return {"iterations": len(full), "drift_median": statistics.median(drifts) if drifts else None,
            "drift_max": max(drifts) if drifts else None, "order_breaks": breaks, "sends_after_backward": sends,
            "push_skew_median": statistics.median(skews) if skews else None}


def table(labelled: Sequence[tuple[str, dict]]) -> str:
    rows = ["| traces | iterations | drift between servers, median / max (s) | order breaks after backward | "
            "push skew at the server, median (s) |", "|---|---|---|---|---|"]
    for label, a in labelled:
        if not a["iterations"]:
            rows.append(f"| {label} | 0 | - | - | - |")
            continue
        rows.append(f"| {label} | {a['iterations']} | {a['drift_median']:.2f} / {a['drift_max']:.2f} | "
                    f"{a['order_breaks']} of {a['sends_after_backward']} | {a['push_skew_median']:.2f} |")
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    prefixes = list(sys.argv[1:] if argv is None else argv)
    if not prefixes:
        sys.stderr.write(__doc__)
        return 2
    labelled = []
    for prefix in prefixes:
        workers, servers = _nodes(prefix, "worker"), _nodes(prefix, "server")
        if not workers:
            sys.stderr.write(f"no worker traces {prefix}.worker<r>.json\n")
            return 1
        labelled.append((prefix.rsplit("/", 1)[-1], anatomy(workers, servers)))
    sys.stdout.write(table(labelled))
    return 0


if __name__ == "__main__":
    sys.exit(main())
