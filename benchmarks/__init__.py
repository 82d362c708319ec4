"""p3kv's benchmarks, laid out by role (README.md here): emulation, workloads, analysis, suites, report, sim.

`python -m benchmarks` lists the suites, their estimated run times and how to run each.
"""
