"""The test tiers and the shared fixtures. tests/harness.py starts p3kv processes; tests/cpp_build.py builds the
C++ unit tests.

Every test has exactly one tier (a `pytestmark = pytest.mark.TIER` line at the top of its module, or a mark per
test where a module mixes tiers); collection fails otherwise. `pytest -m unit` runs one tier.
"""

import os

import pytest
from harness import ROOT, SCRIPTS, run_job  # noqa: F401  (tests once imported these from here)

# tests/gpu/ is a prepared script for a lent GPU (run_gpu_check.sh), not part of the suite: CI has no GPU
# (tests/README.md, "GPU check"). (A conftest.py of its own would shadow this one: tests import `conftest` by name.)
collect_ignore = ["gpu"]

# name -> what a test of the tier may do (also registered in pyproject.toml, which --strict-markers enforces)
TIERS = {
    "unit": "one process, no p3kv job and no MXNet training: pure Python and the C++ unit tests",
    "integration": "real p3kv jobs over loopback with numpy workers (the launcher, node by node, raw sockets)",
    "mxnet": "MXNet in the loop: kvstore='p3' and the baselines in jobs, Gluon/Module/Sockeye training",
    "system": "root: network namespaces and tc, sshd and Fabric (skipped with the reason when not root)",
    "sanitizer": "the C++ tests under ASan+UBSan and TSan, and jobs with the extension built with ASan+UBSan",
}


def pytest_collection_modifyitems(config, items):
    wrong = []
    for item in items:
        tiers = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})
        if len(tiers) != 1:
            wrong.append(f"{item.nodeid}: {', '.join(tiers) or 'no tier'}")
    if wrong:
        raise pytest.UsageError("every test needs exactly one tier mark (" + ", ".join(TIERS) + "): put "
                                "`pytestmark = pytest.mark.TIER` at the top of its module, or mark each test where "
                                "a module mixes tiers:\n  " + "\n  ".join(wrong))


def pytest_runtest_setup(item):
    if item.get_closest_marker("system") is not None and os.geteuid() != 0:
        pytest.skip("a system test needs root (network namespaces, tc, sshd): CI runs as root; locally use sudo")


@pytest.fixture
def job_runner():
    return run_job


@pytest.fixture
def nodes():
    """The processes a test started (harness.Node objects, or anything with a kill() method); whatever still runs
    at teardown is killed."""
    started: list = []
    yield started
    for node in started:
        node.kill()
