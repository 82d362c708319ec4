"""A p3kv server for tests: optional update function, counters and trace dumped to $P3_TEST_OUT on exit.

P3_TEST_UPDATER: "" (aggregate only), "sgd:<lr>" (value -= lr * aggregated), "slow:<seconds>" (aggregate
only, but each slice's update takes that long: makes the server's consumer the bottleneck).
"""

import json
import os
import sys
import time

from p3kv.core.server import P3Server


def make_updater(spec):
    if not spec:
        return None
    kind, _, arg = spec.partition(":")
    if kind == "sgd":
        lr = float(arg)

        def sgd(key, slc, offset, iteration, aggregated, value):
            value -= (lr * aggregated).astype(value.dtype)

        return sgd
    if kind == "slow":
        delay = float(arg)

        def slow(key, slc, offset, iteration, aggregated, value):
            time.sleep(delay)
            value[...] = aggregated

        return slow
    raise SystemExit(f"unknown P3_TEST_UPDATER {spec!r}")


def main():
    server = P3Server(updater=make_updater(os.environ.get("P3_TEST_UPDATER", "")))
    status = 0
    try:
        server.run()
    except Exception as e:  # reported through the exit code and stderr, like p3kv.core.server.main
        sys.stderr.write(f"test server failed: {e}\n")
        status = 1
    out = os.environ.get("P3_TEST_OUT")
    if out:
        with open(os.path.join(out, f"server{server.rank}.json"), "w") as f:
            json.dump({"counters": server.counters(), "trace": server.trace_events()}, f)
    return status


if __name__ == "__main__":
    sys.exit(main())
