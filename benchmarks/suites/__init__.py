"""The benchmark suites: each module is one command (`python -m benchmarks.suites.NAME`) that runs jobs and writes
its rows under benchmarks/results/."""
