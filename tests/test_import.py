"""`import p3kv` from a folder whose C++ core is not built (the README's `pip install .`, then its examples run
from the checkout: the source folder shadows the installed package) fails with a message that says what to do."""

import shutil
import subprocess
import sys

from conftest import ROOT


def copy_without_core(dest):
    shutil.copytree(f"{ROOT}/p3kv", dest / "p3kv", ignore=shutil.ignore_patterns("_p3*.so", "__pycache__"))


def import_in(cwd, code, pythonpath=""):
    """Runs `code` in a fresh interpreter without site-packages (-S): the test's own p3kv may be installed in
    editable mode there, and its finder would supply the core."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": pythonpath}
    return subprocess.run([sys.executable, "-S", "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


def test_missing_core_says_to_build_it(tmp_path):
    copy_without_core(tmp_path)
    result = import_in(tmp_path, "import p3kv, p3kv.core.node")
    assert result.returncode == 1
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError: cannot import p3kv's C++ core: p3kv's C++ core (p3kv/_p3*.so) is not "
                              f"built in {tmp_path / 'p3kv'}"), message
    assert "pip install -e ." in message and "python setup.py build_ext --inplace" in message, message
    # `import p3kv` alone stays cheap and works (the core is imported when a node is created).
    assert import_in(tmp_path, "import p3kv; print(p3kv.__version__)").returncode == 0


def test_source_folder_shadowing_an_installed_p3kv_is_named(tmp_path):
    (tmp_path / "checkout").mkdir()
    copy_without_core(tmp_path / "checkout")
    installed = tmp_path / "site-packages"
    copy_without_core(installed)
    (installed / "p3kv" / "_p3.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")  # only its name matters here
    result = import_in(tmp_path / "checkout", "from p3kv import _p3", pythonpath=str(installed))
    message = result.stderr.strip().splitlines()[-1]
    assert f"shadows the installed p3kv at {installed / 'p3kv'}" in message, message
    assert "Run from another directory" in message and "python setup.py build_ext --inplace" in message, message
