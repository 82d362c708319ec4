"""A p3kv server whose update function raises ValueError("boom") at iteration 2 (and otherwise stores the sum,
like the default server). Run through ``p3kv.core.server.main`` so its exit codes are the real server's."""

import sys

from p3kv.core.server import main

FAILING_ITERATION = 2


def update(key, slice_, offset, iteration, aggregated, value):
    if iteration == FAILING_ITERATION:
        raise ValueError("boom")
    value[:] = aggregated


if __name__ == "__main__":
    sys.exit(main(updater=update))
