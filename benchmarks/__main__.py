"""`python -m benchmarks`: the suites, what each measures, how to run it and how long it takes."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from benchmarks.suites import demo, sweeps
from benchmarks.suites.catalogue import SUITES


def sweep_times() -> tuple[dict[str, tuple[float, float]], str]:
    """{sweep: (hours for every run, hours for the runs results/sweeps/ lacks)} and where the factors come from."""
    rows, source = sweeps.estimates(sweeps.parse_args(["estimate"]), sweeps.RESULTS)
    return {name: (full / 3600, left / 3600) for name, full, left in rows}, source


def demo_seconds() -> float:
    """`make demo`'s run time: its jobs, estimated as the sweeps' are (the bound scaled by measured rows)."""
    return sweeps.estimate_seconds(demo.points(demo.parse_args([])), 1, sweeps.measured_factors())


def tune_hours() -> float:
    """`python -m benchmarks tune --headline`'s run time, estimated as the sweeps' are."""
    from benchmarks.suites import tune

    return tune.estimate_seconds(tune.parse_args(["--headline"])) / 3600


def listing() -> str:
    times, source = sweep_times()
    total = (sum(t[0] for t in times.values()), sum(t[1] for t in times.values()))
    lines = ["Benchmark suites (benchmarks/README.md: the layout; each module's --help: its options)", ""]
    for suite in SUITES:
        if suite.name == "demo":
            when = f"{demo_seconds() / 60:.1f} min after set-up (estimated)"
        elif suite.name == "demo-full":
            when = f"{times['demo'][0] * 60:.0f} min (estimated)"
        elif suite.name == "sweeps":
            when = f"{total[0]:.1f} h in full, {total[1]:.1f} h not yet in results/sweeps/ (estimated)"
        elif suite.name == "tune":
            when = f"{tune_hours():.1f} h for its --headline points (estimated)"
        else:
            when = suite.stated_time
        lines += [f"{suite.name:14s} {suite.what}",
                  f"{'':14s} run:  {suite.command}{'  (root: network namespaces)' if suite.root else ''}",
                  f"{'':14s} time: {when}"]
    lines += ["", "Sweeps one by one (python -m benchmarks.suites.sweeps NAME):"]
    lines += [f"  {name:12s} {full:5.1f} h   not yet run: {left:5.1f} h" for name, (full, left) in times.items()]
    lines += [f"Estimated: {source}; on an idle 2-core machine."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    runnable = {s.name: s.module for s in SUITES if s.module}
    if argv and argv[0] in runnable:  # python -m benchmarks tune ARGS...: that suite's own command line
        return importlib.import_module(runnable[argv[0]]).main(argv[1:])
    argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                            epilog=f"python -m benchmarks SUITE [options] runs one of: {', '.join(runnable)} "
                            "(SUITE --help: its options)").parse_args(argv)
    sys.stdout.write(listing())
    return 0


if __name__ == "__main__":
    sys.exit(main())
