"""The configuration table: parsing, clear errors, and the README's table kept in sync."""

import os

import pytest

from p3kv.core import config
from p3kv.core.config import Role
from p3kv.core.errors import ConfigError
from p3kv.core.keys import key_id

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


def test_readme_configuration_table_is_current():
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert config.markdown_table() in readme, "regenerate it with: python -m p3kv.core.config --markdown"


def test_key_ids_are_stable_and_disjoint():
    assert key_id(7) == 7
    assert key_id("fc1_weight") == key_id("fc1_weight") != key_id("fc1_bias")
    assert key_id("fc1_weight") >= 1 << 63  # strings never collide with int keys
    for bad in (-1, 1 << 62, 1.5, None, True):
        with pytest.raises(ConfigError):
            key_id(bad)
