"""p3kv.torch's worker placement in jobs: priorities follow the forward pass, the next forward overlaps the
communication of the last layer, unused parameters end the job with an error or push zeros, and a killed worker
ends every process of the job."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest
from harness import FAILURE_BOUND, ROLE_COMMANDS, free_port, start_node
from torch_jobs import TRAIN, p3kv_job

from p3kv.core.keys import key_id

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch", reason="p3kv.torch needs torch (pip install '.[torch]')")

# tests/scripts/torch_train.py's "reversed" model registers c, b, a and calls a, b, c.
FORWARD_ORDER = ["a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias"]


def read_trace(path) -> list[dict]:
    with open(path) as f:
        return [e["args"] | {"ns": round(e["ts"] * 1000)} for e in json.load(f)["traceEvents"]]


def test_priorities_follow_the_forward_pass_not_registration_order(tmp_path):
    result = p3kv_job(tmp_path / "out.pt", "--steps", "3", env={"P3_TRACE": str(tmp_path / "trace")})
    assert result.returncode == 0, result.stdout
    ids = {key_id(f"param:{name}"): name for name in FORWARD_ORDER}
    for rank in range(2):
        priorities: dict[str, set] = {}
        for e in read_trace(tmp_path / f"trace.worker{rank}.json"):
            # (init's slices go first of all, at the largest priority)
            if e["key"] in ids and e["event"] in ("enqueue", "send") and e["priority"] != 2**31 - 1:
                priorities.setdefault(ids[e["key"]], set()).add(e["priority"])
        # One priority per key, the same for every slice and iteration (the first included): 0 for the first
        # parameter of the forward pass, then -1, -2, ...
        assert priorities == {name: {-i} for i, name in enumerate(FORWARD_ORDER)}, priorities


STEPS = 5


def test_the_next_forward_passes_the_first_layer_before_the_last_layers_average_arrives(tmp_path):
    marks = tmp_path / "marks"
    result = p3kv_job(tmp_path / "out.pt", "--model", "wide", "--steps", str(STEPS), "--marks", str(marks),
                      env={"P3_TRACE": str(tmp_path / "trace"), "P3_SLICE_SIZE": "50000"})
    assert result.returncode == 0, result.stdout
    last = key_id("param:c.weight")
    for rank in range(2):
        with open(f"{marks}.rank{rank}.json") as f:
            passed = json.load(f)  # when the forward of each step had run layer a (the first)
        assert len(passed) == STEPS
        events = read_trace(tmp_path / f"trace.worker{rank}.json")
        done: dict[int, int] = {}  # iteration -> when its last slice of the last layer completed
        for e in events:
            if e["event"] == "complete" and e["key"] == last:
                done[e["iteration"]] = max(done.get(e["iteration"], 0), e["ns"])
        assert len(done) >= STEPS, done  # one per step (and init's)
        completes = [done[i] for i in sorted(done)[-STEPS:]]
        # The average of step s's last layer completes after the forward of step s+1 passed the first layer.
        margins = [(completes[s] - passed[s + 1]) / 1e6 for s in range(STEPS - 1)]
        print(f"worker {rank}: next forward passed layer a ms before the last layer's average: {margins}")
        # On an idle machine every step overlaps; a worker starved of CPU may see the last layer arrive first.
        assert any(m > 0 for m in margins), margins


def test_an_unused_parameter_ends_the_job_with_an_error_naming_it_and_the_fix(tmp_path):
    started = time.monotonic()
    result = p3kv_job(tmp_path / "out.pt", "--model", "unused", "--steps", "3")
    assert result.returncode != 0, result.stdout
    assert "2 parameter(s) got no gradient since the last step(): spare.weight, spare.bias" in result.stdout, \
        result.stdout
    # The worker that raised is the one the launcher names (it left without closing: not "uneven data shards").
    assert "worker 1 exited with code 1" in result.stdout, result.stdout
    assert "unused_parameters='zeros'" in result.stdout
    assert time.monotonic() - started < 120  # not the job's timeout


def test_unused_parameters_zeros_push_zeros_and_the_workers_stay_equal(tmp_path):
    result = p3kv_job(tmp_path / "out.pt", "--model", "unused", "--steps", "3", "--unused", "zeros")
    assert result.returncode == 0, result.stdout
    sums = {line.split()[-1] for line in result.stdout.splitlines() if " checksum " in line}
    assert len(sums) == 1, result.stdout


def test_a_killed_worker_ends_every_process_naming_it(nodes):
    port = free_port()
    scheduler = start_node(nodes, "scheduler", ROLE_COMMANDS["scheduler"], "scheduler", port)
    servers = [start_node(nodes, f"server {i}", [sys.executable, "-m", "p3kv.core.server"], "server", port)
               for i in range(2)]
    workers = [start_node(nodes, f"worker process {i}", [sys.executable, TRAIN, "p3kv", os.devnull, "--steps",
                                                         "100000"], "worker", port) for i in range(2)]
    pids = {}
    for node in workers:
        m = node.wait_for(r"^ready rank=(\d) pid=(\d+)$", timeout=60)
        pids[int(m.group(1))] = (node, int(m.group(2)))
    for node in workers:
        node.wait_for(r"^step 3 loss", timeout=60)
    victim, pid = pids[1]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    survivor = pids[0][0]
    assert survivor.finish(FAILURE_BOUND) != 0, survivor.output
    assert "P3Error" in survivor.output and "worker 1" in survivor.output, survivor.output
    assert victim.finish(FAILURE_BOUND) == -signal.SIGKILL
    for node in [*servers, scheduler]:
        assert node.finish(FAILURE_BOUND) == 1, node.output
    assert time.monotonic() - killed < FAILURE_BOUND
