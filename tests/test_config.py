"""The configuration table: parsing, clear errors, and docs/configuration.md's table kept in sync."""

import ast
import os
import pathlib
import re

import pytest

from p3kv.core import config
from p3kv.core.config import Role
from p3kv.core.errors import ConfigError
from p3kv.core.keys import key_id

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = {"P3_ROOT_URI": "127.0.0.1", "P3_ROOT_PORT": "9000", "P3_NUM_WORKER": "2", "P3_NUM_SERVER": "3"}


def test_load_reads_job_and_defaults():
    c = config.load(dict(JOB, P3_ROLE="worker"))
    assert (c.role, c.root_port, c.num_worker, c.num_server) == (Role.WORKER, 9000, 2, 3)
    assert c.slice_size == 50_000  # the paper's optimum
    assert config.load(JOB, role=Role.SERVER, slice_size=40_000).slice_size == 40_000


@pytest.mark.parametrize("env,needle", [
    ({k: v for k, v in JOB.items() if k != "P3_ROOT_PORT"}, "P3_ROOT_PORT"),
    (dict(JOB, P3_NUM_WORKER="abc"), "P3_NUM_WORKER"),
    (dict(JOB, P3_NUM_SERVER="0"), "P3_NUM_SERVER"),
    (dict(JOB, P3_ROOT_PORT="70000"), "P3_ROOT_PORT"),
    (dict(JOB, P3_SLICE_SIZE="-5"), "P3_SLICE_SIZE"),
    (dict(JOB, P3_PRELOAD_MXNET="2"), "P3_PRELOAD_MXNET"),
])
def test_bad_environment_names_the_variable(env, needle):
    with pytest.raises(ConfigError, match=needle):
        config.load(env, role=Role.WORKER)


def test_missing_role_says_what_to_set():
    with pytest.raises(ConfigError, match="P3_ROLE"):
        config.load(JOB)
    with pytest.raises(ConfigError, match="not a role"):
        config.load(dict(JOB, P3_ROLE="boss"))


def test_unknown_interface_lists_real_ones():
    with pytest.raises(ConfigError, match="no such network interface.*lo"):
        config.load(dict(JOB, P3_INTERFACE="nonexistent0"), role=Role.WORKER).bind_host()
    assert config.load(dict(JOB, P3_INTERFACE="lo"), role=Role.WORKER).bind_host() == "127.0.0.1"


def test_docs_configuration_table_is_current():
    docs = open(os.path.join(ROOT, "docs", "configuration.md")).read()
    assert config.markdown_table() in docs, "regenerate it with: python -m p3kv.core.config --markdown"


def test_key_ids_are_stable_and_disjoint():
    assert key_id(7) == 7
    assert key_id("fc1_weight") == key_id("fc1_weight") != key_id("fc1_bias")
    assert key_id("fc1_weight") >= 1 << 63  # strings never collide with int keys
    for bad in (-1, 1 << 62, 1.5, None, True):
        with pytest.raises(ConfigError):
            key_id(bad)


# Where the environment may be read: the table, and the launcher (it hands its environment to the processes it
# starts). Everything else asks config.get / config.load, so that every variable is in the table.
ENVIRONMENT_READERS = {"p3kv/core/config.py", "p3kv/launch/launcher.py"}
VARIABLE_NAME = re.compile(r"(P3|MXNET|DMLC)_[A-Z0-9_]+")


def _package_sources():
    for path in sorted(pathlib.Path(ROOT, "p3kv").rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), filename=str(path))


def _environment_reads(tree) -> list[str]:
    """Every os.environ / os.getenv / os.environb (also imported by name, `from os import environ`) in `tree`."""
    names = {"environ", "environb", "getenv", "getenvb"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names:
            found.append(f"line {node.lineno}: os.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [f"line {node.lineno}: from os import {a.name}" for a in node.names if a.name in names]
    return found


def test_only_the_config_table_and_the_launcher_read_the_environment():
    sources = dict(_package_sources())
    assert ENVIRONMENT_READERS <= set(sources)
    assert _environment_reads(sources["p3kv/core/config.py"])  # the check can see a read
    readers = {path: reads for path, tree in sources.items() if path not in ENVIRONMENT_READERS
               for reads in [_environment_reads(tree)] if reads}
    assert readers == {}, "read the environment through p3kv.core.config (and declare the variable there)"


def test_every_variable_the_package_names_is_in_the_table():
    # The launcher writes ps-lite's DMLC_* variables for baseline processes; everything else only reads.
    declared = {v.name for v in config.VARIABLES}
    named = {node.value: path for path, tree in _package_sources() if not path.startswith("p3kv/launch/")
             for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and VARIABLE_NAME.fullmatch(node.value)}
    assert {"P3_ROLE", "MXNET_UPDATE_ON_KVSTORE", config.BULK_VARIABLE} <= set(named)
    assert {name: path for name, path in named.items() if name not in declared} == {}
    # One definition of MXNet's bulk variable: the table's.
    bulk = [path for path, tree in _package_sources() for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value == config.BULK_VARIABLE]
    assert bulk == ["p3kv/core/config.py"]


def test_mxnet_variables_are_read_through_the_table():
    assert config.get("MXNET_UPDATE_ON_KVSTORE", {}) == 1
    assert config.get("MXNET_UPDATE_ON_KVSTORE", {"MXNET_UPDATE_ON_KVSTORE": "0"}) == 0
    assert config.get(config.BULK_VARIABLE, {config.BULK_VARIABLE: "1"}) == "1"
    with pytest.raises(ConfigError, match="MXNET_UPDATE_ON_KVSTORE"):
        config.get("MXNET_UPDATE_ON_KVSTORE", {"MXNET_UPDATE_ON_KVSTORE": "yes"})
    # They are not fields of a node's Config, and the launcher does not pass them on as P3 variables.
    c = config.load(JOB, role=Role.WORKER)
    assert not any(name.startswith(("MXNET_", "DMLC_")) for name in config.environment_for(c, Role.WORKER))
